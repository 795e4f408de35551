"""``openrft serve-model`` on 127.0.0.1, driven by the official ``openai`` client and by OpenRFT's
remote generator (the vLLM subset of the API): adapters load by name and change the outputs, and the
returned log-probs are the model's."""

import dataclasses
import shutil
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import openai
import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

from openrft.cli import main
from openrft.models import eos_token_ids, load_causal_lm, load_tokenizer
from openrft.rollout.prompts import render_prompt
from openrft.rollout.remote import GenerationServerError, RemoteGenerator, lora_target_modules
from openrft.rollout.sampling import scaled_log_probs
from openrft.rollout.types import SamplingParams
from openrft.rollout.weight_files import INDEX, block_of, weight_files, weight_shapes
from openrft.spec.job import LoraSpec
from tests.server.serve_model import serve_model

PROMPT = [{"role": "user", "content": "What is 95-73?"}]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32), load_tokenizer("openrft-demo")


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """A PEFT LoRA adapter with random (non-zero) B matrices: it changes the model's outputs."""
    torch.manual_seed(0)
    base = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    )
    directory = tmp_path_factory.mktemp("adapter") / "random-lora"
    peft_model.save_pretrained(str(directory))
    return directory, {k: v.clone() for k, v in get_peft_model_state_dict(peft_model).items()}, peft_model.eval()


@pytest.fixture(scope="module")
def server(adapter, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    roots = ("--allow-load-from", str(tmp_path_factory.getbasetemp()))  # every test's tmp_path
    with serve_model("openrft-demo", log, "--adapter", f"startup={adapter[0]}", *roots) as url:
        yield url


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def _teacher_forced_logp(model, prompt_ids, token_ids, temperature=1.0):
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    return scaled_log_probs(logits, temperature).gather(-1, torch.tensor(token_ids).unsqueeze(-1)).squeeze(-1)


def test_models_adapters_and_different_outputs(server, client, adapter):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["openrft-demo", "startup"]

    r = httpx.post(f"{server}/v1/load_lora_adapter", json={"lora_name": "tuned", "lora_path": str(adapter[0])})
    assert r.status_code == 200 and "tuned" in r.text
    again = httpx.post(f"{server}/v1/load_lora_adapter", json={"lora_name": "tuned", "lora_path": str(adapter[0])})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    cards = {m["id"]: m for m in httpx.get(f"{server}/v1/models").json()["data"]}
    assert cards["tuned"]["parent"] == "openrft-demo" and cards["tuned"]["root"] == "tuned"  # no host path

    base = client.chat.completions.create(model="openrft-demo", messages=PROMPT, max_tokens=8, temperature=0)
    tuned = client.chat.completions.create(model="tuned", messages=PROMPT, max_tokens=8, temperature=0)
    startup = client.chat.completions.create(model="startup", messages=PROMPT, max_tokens=8, temperature=0)
    assert base.choices[0].message.content != tuned.choices[0].message.content
    assert tuned.choices[0].message.content == startup.choices[0].message.content  # the same adapter twice
    assert base.choices[0].message.role == "assistant" and base.usage.completion_tokens >= 1

    assert httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "tuned"}).status_code == 200
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="tuned", messages=PROMPT, max_tokens=2)
    missing = httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "tuned"})
    assert missing.status_code == 404
    outside = httpx.post(f"{server}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nonexistent"})
    assert outside.status_code == 403 and "not under a directory" in outside.json()["error"]["message"]
    bad_path = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(adapter[0].parent / "missing")}
    )
    assert bad_path.status_code == 400 and "cannot load LoRA adapter 'x'" in bad_path.json()["error"]["message"]
    assert str(adapter[0].parent) not in bad_path.text  # no host path in the answer


def test_completions_with_token_ids_n_and_logprobs(client, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    other = [{"role": "user", "content": "What is 30+45?"}]
    prompts = [render_prompt(tokenizer, PROMPT), render_prompt(tokenizer, other)]
    result = client.completions.create(
        model="openrft-demo",
        prompt=prompts,
        n=3,
        max_tokens=6,
        temperature=0.7,
        logprobs=2,
        seed=5,
        extra_body={"top_k": 8, "return_tokens_as_token_ids": True},
    )
    assert [c.index for c in result.choices] == list(range(6))
    for choice in result.choices:
        prompt = prompts[choice.index // 3]
        token_ids = [int(t.split(":")[1]) for t in choice.logprobs.tokens]
        assert choice.finish_reason in ("stop", "length") and 1 <= len(token_ids) <= 6
        expected = _teacher_forced_logp(model, prompt, token_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(choice.logprobs.token_logprobs), expected, atol=1e-4)
        for token, lp, top in zip(choice.logprobs.tokens, choice.logprobs.token_logprobs, choice.logprobs.top_logprobs):
            assert top[token] == lp and len(top) in (2, 3)  # the sampled token and the top 2
            assert max(top.values()) >= lp
    again = client.completions.create(
        model="openrft-demo", prompt=prompts, n=3, max_tokens=6, temperature=0.7, seed=5, extra_body={"top_k": 8}
    )
    assert [c.text for c in again.choices] == [c.text for c in result.choices]  # a seed makes it repeatable

    chat = client.chat.completions.create(
        model="openrft-demo", messages=PROMPT, n=2, max_tokens=5, temperature=1.0, logprobs=True, top_logprobs=3
    )
    assert len(chat.choices) == 2
    content = chat.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 3 for t in content)
    assert all(t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob for t in content)

    with pytest.raises(openai.BadRequestError, match="stream"):
        client.completions.create(model="openrft-demo", prompt=prompts[0], stream=True)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="openrft-demo", prompt=prompts[0], max_tokens=100_000)


def test_remote_generator_loads_versions_and_samples_with_exact_logprobs(
    server, adapter, model_and_tokenizer, tmp_path
):
    model, tokenizer = model_and_tokenizer
    _, weights, peft_model = adapter
    assert lora_target_modules(weights) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    lora = LoraSpec(rank=4, alpha=16)
    generator = RemoteGenerator(
        server,
        adapter_dir=tmp_path / "served",
        lora=lora,
        base_model="openrft-demo",
        eos_token_ids=eos_token_ids(tokenizer, model),
        adapter_prefix="job-r0",
    )
    prompt = render_prompt(tokenizer, PROMPT)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6)

    generator.load_adapter({k: torch.zeros_like(v) if "lora_B" in k else v for k, v in weights.items()}, 0)
    generator.load_adapter(weights, 1)
    served = [m["id"] for m in httpx.get(f"{server}/v1/models").json()["data"]]
    assert "job-r0-v1" in served and "job-r0-v0" not in served  # the previous version was unloaded
    assert not (tmp_path / "served" / "job-r0-v0").exists()

    [group] = generator.generate([prompt], params)
    assert len(group) == 4 and generator.policy_version == 1
    for completion in group:
        assert completion.policy_version == 1 and completion.prompt_ids == prompt
        expected = _teacher_forced_logp(peft_model, prompt, completion.token_ids)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)
        stops = completion.finish_reason == "stop"
        assert stops == (completion.token_ids[-1] in generator.eos_token_ids)
        assert completion.text == tokenizer.decode(
            completion.token_ids[:-1] if stops else completion.token_ids, skip_special_tokens=True
        )

    # max_length per sample: prompts of two lengths go in one request per completion limit, back in order
    short = prompt[:-3]
    capped = SamplingParams(n=4, temperature=1.0, max_new_tokens=6, max_length=len(prompt) + 2)
    groups = generator.generate([prompt, short, prompt], capped)
    for asked, group in zip([prompt, short, prompt], groups, strict=True):
        limit = capped.completion_limit(len(asked))
        for completion in group:
            assert completion.prompt_ids == asked and len(completion.token_ids) <= limit
            assert completion.finish_reason == "stop" or len(completion.token_ids) == limit
    assert {len(c.token_ids) for c in groups[0] + groups[2]} <= {1, 2}
    assert capped.completion_limit(len(short)) == 5
    generator.close()

    down = RemoteGenerator(
        "http://127.0.0.1:9", adapter_dir=tmp_path / "x", lora=lora, base_model="m", eos_token_ids=[0], retries=0
    )
    with pytest.raises(GenerationServerError, match=r"cannot reach the generation server at http://127\.0\.0\.1:9/v1"):
        down.generate([prompt], params)
    shutil.rmtree(tmp_path / "served", ignore_errors=True)


def test_ignore_eos_reaches_the_server_and_every_answer_runs_to_max_tokens(server, model_and_tokenizer, tmp_path):
    """The client sends every token as a stop token: answers end at once; with ``ignore_eos`` it sends none and
    ``ignore_eos: true``, and the server does not stop at its model's own end tokens either."""
    model, tokenizer = model_and_tokenizer
    every_token = list(range(model.config.vocab_size))
    generator = RemoteGenerator(
        server, adapter_dir=tmp_path, lora=LoraSpec(), base_model="openrft-demo", eos_token_ids=every_token
    )
    prompt = render_prompt(tokenizer, PROMPT)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6)
    [stopped] = generator.generate([prompt], params)
    assert all(len(c.token_ids) == 1 and c.finish_reason == "stop" for c in stopped)
    [full] = generator.generate([prompt], dataclasses.replace(params, ignore_eos=True))
    assert all(len(c.token_ids) == 6 and c.finish_reason == "length" for c in full)
    generator.close()


def test_cli_rejects_a_malformed_adapter_argument(capsys):
    assert main(["serve-model", "openrft-demo", "--adapter", "no-equals-sign"]) == 2
    assert "expected NAME=PATH" in capsys.readouterr().err


# full fine-tuning: the whole model's weights (POST /v1/load_weights) ----------------------------------


def _full_generator(url: str, tokenizer, model, tmp_path) -> RemoteGenerator:
    return RemoteGenerator(
        url,
        adapter_dir=tmp_path / "served",
        lora=LoraSpec(enabled=False),
        base_model="openrft-demo",
        eos_token_ids=eos_token_ids(tokenizer, model),
        adapter_prefix="full",
        retries=0,
    )


def test_full_weights_reach_the_server_and_it_samples_from_them(server, model_and_tokenizer, tmp_path):
    base, tokenizer = model_and_tokenizer
    tuned = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in tuned.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=g))
    generator = _full_generator(server, tokenizer, base, tmp_path)
    prompt = render_prompt(tokenizer, PROMPT)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6)

    generator.load_adapter({k: v.clone() for k, v in base.state_dict().items()}, 1)
    try:
        generator.load_adapter({k: v.clone() for k, v in tuned.state_dict().items()}, 2)
        assert generator.policy_version == 2
        assert sorted(p.name for p in (tmp_path / "served").iterdir()) == ["full-v2"]  # the previous file removed
        # a file per decoder block (4) and one for the rest, with the index vLLM's loader reads
        files = weight_files(tmp_path / "served" / "full-v2")
        assert len(files) == 5 and (tmp_path / "served" / "full-v2" / INDEX).exists()
        blocks = [{block_of(name) for name in weight_shapes([file])} for file in files]
        assert sorted(b.pop() for b in blocks if len(b) == 1) == ["", *(f"model.layers.{i}" for i in range(4))]
        [group] = generator.generate([prompt], params)
        for completion in group:
            assert completion.policy_version == 2
            got = torch.tensor(completion.logprobs)
            assert torch.allclose(got, _teacher_forced_logp(tuned.eval(), prompt, completion.token_ids), atol=1e-4)
            assert not torch.allclose(got, _teacher_forced_logp(base, prompt, completion.token_ids), atol=1e-3)
    finally:  # the other tests of this module serve the base model
        generator.load_adapter({k: v.clone() for k, v in base.state_dict().items()}, 3)


def test_weights_that_do_not_fit_are_refused_naming_the_path(server, tmp_path):
    from safetensors.torch import save_file

    save_file({"model.not_a_layer.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    response = httpx.post(f"{server}/v1/load_weights", json={"path": str(tmp_path)})
    assert response.status_code == 400 and "model.not_a_layer.weight" in response.json()["error"]["message"]
    empty = httpx.post(f"{server}/v1/load_weights", json={"path": str(tmp_path / "missing")})
    assert empty.status_code == 400 and "no *.safetensors files" in empty.json()["error"]["message"]


class _NoSuchRoute(BaseHTTPRequestHandler):
    def do_POST(self):  # http.server's name
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"detail": "Not Found"}')

    def log_message(self, *args):
        pass


def test_a_server_without_the_weights_route_is_refused_by_name(model_and_tokenizer, tmp_path):
    base, tokenizer = model_and_tokenizer
    http = HTTPServer(("127.0.0.1", 0), _NoSuchRoute)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        generator = _full_generator(f"http://127.0.0.1:{http.server_port}", tokenizer, base, tmp_path)
        with pytest.raises(
            GenerationServerError,
            match=r"takes no full weights.*POST /v1/load_weights.*POST /collective_rpc.*VLLM_SERVER_DEV_MODE=1",
        ):
            generator.load_adapter({"lm_head.weight": torch.zeros(2, 2)}, 1)
    finally:
        http.shutdown()
