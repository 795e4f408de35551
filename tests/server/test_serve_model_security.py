"""``openrft serve-model`` as an attacker would try it (issue 24): without the key nothing answers; weights
load only from the allowed directories, symlinks resolved; answers show no host path; bad token ids and
oversized requests are 400 naming the cap; a big request does not hold the model while another waits."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

from openrft.cli import main
from openrft.models import eos_token_ids, load_causal_lm, load_tokenizer
from openrft.rollout.server import ModelServer
from openrft.rollout.server_guard import FairLock, ServeLimits
from openrft.rollout.types import SamplingParams
from tests.server.serve_model import serve_model

KEY = "sk-serve-model-test-key"


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory):
    """An allowed root holding a real adapter and a symlink to one outside it; the outside adapter."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=2, lora_alpha=8, target_modules="all-linear"))
    allowed, outside = tmp_path_factory.mktemp("allowed"), tmp_path_factory.mktemp("outside")
    peft_model.save_pretrained(str(allowed / "lora"))
    peft_model.save_pretrained(str(outside / "lora"))
    (allowed / "escape").symlink_to(outside / "lora", target_is_directory=True)
    return allowed, outside


@pytest.fixture(scope="module")
def server(adapter_dirs, tmp_path_factory):
    allowed, outside = adapter_dirs
    log = tmp_path_factory.mktemp("secure-server") / "server.log"
    options = ["--api-key", KEY, "--allow-load-from", str(allowed), "--adapter", f"startup={outside / 'lora'}"]
    options += ["--max-samples-per-request", "16", "--max-tokens-per-request", "2000"]
    with (
        serve_model("openrft-demo", log, *options) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as client,
    ):
        yield url, client


def test_every_route_but_health_needs_the_key(server):
    url, _ = server
    assert httpx.get(f"{url}/health").status_code == 200
    attempts = [
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/v1/load_weights", {"path": "/tmp"}),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}),
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "startup"}),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        for method, path, body in attempts:
            response = httpx.request(method, f"{url}{path}", json=body, headers=headers)
            assert response.status_code == 401, (path, headers, response.text)
    ok = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200


def test_weights_load_only_from_the_allowed_root_after_resolving_symlinks(server, adapter_dirs):
    _, client = server
    allowed, outside = adapter_dirs
    for path, param in ((outside / "lora", "lora_path"), (allowed / "escape", "lora_path"), ("/etc", "lora_path")):
        response = client.post("/v1/load_lora_adapter", json={"lora_name": "evil", "lora_path": str(path)})
        assert response.status_code == 403, response.text
        assert response.json()["error"]["param"] == param
        if path == allowed / "escape":
            assert str(outside) not in response.text  # where the link points is not shown
    sneaky = client.post("/v1/load_lora_adapter", json={"lora_name": "evil", "lora_path": f"{allowed}/../outside"})
    assert sneaky.status_code == 403
    for path in (outside / "lora", allowed / "escape", f"{allowed}/.."):
        weights = client.post("/v1/load_weights", json={"path": str(path)})
        assert weights.status_code == 403 and weights.json()["error"]["param"] == "path", weights.text
    good = client.post("/v1/load_lora_adapter", json={"lora_name": "mine", "lora_path": str(allowed / "lora")})
    assert good.status_code == 200, good.text
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "mine"}).status_code == 200


def test_no_host_path_in_the_models_list(server, adapter_dirs):
    _, client = server
    text = client.get("/v1/models").text
    assert "startup" in text
    assert str(adapter_dirs[1]) not in text and "/" not in "".join(
        str(m["root"]) for m in client.get("/v1/models").json()["data"]
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": [1, 10**9], "max_tokens": 2}, "prompt"),
        ({"prompt": [[1, 2], [-5, 3]], "max_tokens": 2}, "prompt"),
        ({"prompt": [1, 2], "max_tokens": 2, "stop_token_ids": [10**9]}, "stop_token_ids"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_400(server, body, param):
    _, client = server
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "outside the vocabulary" in error["message"]


def test_requests_past_the_caps_are_400_naming_them(server):
    _, client = server
    many = client.post("/v1/completions", json={"prompt": [[1, 2]] * 9, "n": 2, "max_tokens": 2})
    assert many.status_code == 400 and "--max-samples-per-request" in many.json()["error"]["message"]
    assert "18 samples" in many.json()["error"]["message"]
    long = client.post("/v1/completions", json={"prompt": [[1, 2]] * 4, "n": 4, "max_tokens": 200})
    assert long.status_code == 400 and "--max-tokens-per-request" in long.json()["error"]["message"]
    fits = client.post("/v1/completions", json={"prompt": [[1, 2]] * 4, "n": 4, "max_tokens": 2})
    assert fits.status_code == 200 and len(fits.json()["choices"]) == 16


def test_a_non_loopback_server_needs_a_key(capsys, monkeypatch):
    monkeypatch.delenv("OPENRFT_SERVE_MODEL_API_KEY", raising=False)
    assert main(["serve-model", "openrft-demo", "--host", "0.0.0.0"]) == 2
    assert "--api-key" in capsys.readouterr().err


def test_the_lock_goes_to_waiting_requests_in_arrival_order():
    lock, order = FairLock(), []
    lock.acquire()
    threads = [threading.Thread(target=lambda i=i: (lock.acquire(), order.append(i), lock.release())) for i in range(5)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # each waits before the next asks
    lock.release()
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2, 3, 4]


def test_a_big_request_does_not_hold_the_model_while_a_small_one_waits():
    """Before: one request held the model's lock for all its prompts (2,000 × n=512: 43 s). The turns are
    recorded in order, so the check does not depend on how fast the host generates."""
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32).eval()
    tokenizer = load_tokenizer("openrft-demo")
    server = ModelServer(
        model, tokenizer, eos_token_ids(tokenizer, model), "demo", limits=ServeLimits(chunk_sequences=2)
    )
    prompt = tokenizer("What is 95-73?")["input_ids"]
    big_params = SamplingParams(n=2, temperature=1.0, max_new_tokens=12)
    small_params = SamplingParams(n=1, temperature=1.0, max_new_tokens=2)
    turns: list[str] = []  # whose chunk held the model, in order
    big_started = threading.Event()
    generate_chunk = server.generator.generate_chunk

    def recorded(chunk, params, rng):
        turns.append("big" if params.max_new_tokens == 12 else "small")
        big_started.set()
        return generate_chunk(chunk, params, rng)

    server.generator.generate_chunk = recorded
    thread = threading.Thread(
        target=lambda: server.generate(None, [prompt] * 40, big_params, seed=1, stop_token_ids=None)
    )
    thread.start()
    assert big_started.wait(60)
    server.generate(None, [prompt], small_params, seed=2, stop_token_ids=None)
    thread.join(300)
    assert turns.count("big") == 40 and turns.count("small") == 1
    assert turns[-1] == "big", f"the small request waited for all of the big one's turns: {turns}"


def test_chunked_generation_is_reproducible_with_a_seed():
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32).eval()
    tokenizer = load_tokenizer("openrft-demo")
    server = ModelServer(
        model, tokenizer, eos_token_ids(tokenizer, model), "demo", limits=ServeLimits(chunk_sequences=2)
    )
    prompts = [tokenizer(f"What is {i}+1?")["input_ids"] for i in range(5)]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6)
    first = server.generate(None, prompts, params, seed=7, stop_token_ids=None)
    second = server.generate(None, prompts, params, seed=7, stop_token_ids=None)
    assert [[c.token_ids for c in g] for g in first] == [[c.token_ids for c in g] for g in second]
    assert len(first) == 5 and all(len(g) == 2 for g in first)


@pytest.mark.parametrize(
    ("prompts", "n", "max_tokens"), [(1, 4096, 16), (2000, 512, 16), (7, 3, 512), (100, 1, 32_768), (5, 64, 600)]
)
def test_each_turn_of_the_lock_is_bounded_in_sequences_and_tokens(prompts, n, max_tokens):
    """Before: a prompt's n samples were one turn however many (one prompt × n=4,096 held the lock throughout)."""
    from openrft.rollout.server import chunks

    limits = ServeLimits()
    plan = list(chunks(prompts, SamplingParams(n=n, max_new_tokens=max_tokens), limits))
    samples = [0] * prompts
    for first, count, each in plan:
        assert count * each <= max(1, min(limits.chunk_sequences, limits.chunk_tokens // max_tokens))
        for prompt in range(first, first + count):
            samples[prompt] += each
    assert samples == [n] * prompts
    assert [first for first, _, _ in plan] == sorted(first for first, _, _ in plan)


class GrantRecordingLock(FairLock):
    """The server's lock, noting which thread each turn went to."""

    def __init__(self) -> None:
        super().__init__()
        self.grants: list[str] = []

    def acquire(self) -> None:
        super().acquire()
        self.grants.append(threading.current_thread().name)


def test_one_prompt_with_many_samples_does_not_hold_the_model_while_a_small_request_waits():
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32).eval()
    tokenizer = load_tokenizer("openrft-demo")
    server = ModelServer(
        model, tokenizer, eos_token_ids(tokenizer, model), "demo", limits=ServeLimits(chunk_sequences=2)
    )
    server.lock = lock = GrantRecordingLock()
    prompt = tokenizer("What is 95-73?")["input_ids"]

    def big():
        groups = server.generate(None, [prompt], SamplingParams(n=80, max_new_tokens=12), seed=1, stop_token_ids=None)
        assert len(groups) == 1 and len(groups[0]) == 80

    thread = threading.Thread(target=big, name="big")
    thread.start()
    deadline = time.monotonic() + 120
    while "big" not in lock.grants and time.monotonic() < deadline:  # the big request holds its first turn
        time.sleep(0.005)
    server.generate(None, [prompt], SamplingParams(n=1, max_new_tokens=2), seed=2, stop_token_ids=None)
    thread.join(300)
    # turns, not timestamps: the small request is served between two of the big one's 40 turns (as a lock held
    # for the whole prompt would never allow), whatever the machine's load
    small = lock.grants.index(threading.current_thread().name)
    assert 0 < small < len(lock.grants) - 1 and lock.grants[-1] == "big", (
        "the prompt's 80 samples held the model in one turn"
    )
