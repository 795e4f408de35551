"""A hostile tenant against the Tinker API (issue 49): every request bounded before any work, only published
models, numbers that can be trained and sampled with, 4xx naming the field for anything malformed and never
a 500, a traceback, SQL or a server path; two checkpoints at one step.

One ``openrft serve`` on 127.0.0.1 with two API keys (tenants), small bounds and an extra published model,
run under a memory limit (``RLIMIT_DATA``): a request that made it allocate what a body declares but
does not carry fails in that server, never in the test process. The official SDK where a tenant would use
it, raw HTTP where the SDK would not send the request.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tinker import types  # noqa: E402
from tinker.proto import tinker_public_pb2 as pb  # noqa: E402

from openrft.models import REGISTERED_MODELS  # noqa: E402
from openrft.service.store import Store  # noqa: E402
from tests.service.svc_helpers import CLI, Process, Service  # noqa: E402
from tests.tinker_api.test_sdk import MODEL, datum, learner_logprobs  # noqa: E402

# the server's data segment (its writable private mappings: mapped libraries, CUDA ones included, do not count);
# its imports, the demo model and these tests take about 1 GB of it
MEMORY_LIMIT = 3 << 30
EXTRA = "demo-copy"  # published by the operator with --model, besides openrft-demo
BROKEN = "broken"  # published too, a directory that holds no model
GONE = "gone"  # published too, a directory removed once the server runs
DEMO_DIR = str(REGISTERED_MODELS[MODEL])
BOUNDS = {"sequence": 256, "call": 1024, "num_samples": 8, "sample": 1024}


class LimitedService(Service):
    """``Service`` whose processes run under ``RLIMIT_DATA``: an allocation past it fails in the server."""

    def _spawn(self, args: list[str], name: str) -> Process:
        log = self.data_dir / f"{name}-{len(self.processes)}.log"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", **self.env}

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))

        proc = subprocess.Popen(
            [sys.executable, "-c", CLI, *args, "--data-dir", str(self.data_dir), "--database-url", self.database_url],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=limit,
        )
        process = Process(proc, log)
        self.processes.append(process)
        return process


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    os.environ["TINKER_TELEMETRY"] = "0"
    root = tmp_path_factory.mktemp("tinker-hostile")
    service = LimitedService(root / "data", f"sqlite:///{root / 'openrft.db'}", env={"HF_HUB_OFFLINE": "1"})
    store = Store.open(service.database_url)
    keys = tuple("tml-" + store.create_key(name)[1] for name in ("a", "b"))
    store.close()
    (root / "broken").mkdir()
    (root / "gone").mkdir()
    extra = (
        *("--model", f"{EXTRA}={DEMO_DIR}"),
        *("--model", f"{BROKEN}={root / 'broken'}"),
        *("--model", f"{GONE}={root / 'gone'}"),
        *("--tinker-max-sequence-tokens", str(BOUNDS["sequence"])),
        *("--tinker-max-call-tokens", str(BOUNDS["call"])),
        *("--tinker-max-num-samples", str(BOUNDS["num_samples"])),
        *("--tinker-max-sample-tokens", str(BOUNDS["sample"])),
    )
    process = service.serve(workers=0, wait=False, extra=extra)
    service.wait_healthy(process, timeout=400)
    (root / "gone").rmdir()
    yield service, keys, process
    print(f"the server's data segment at the end: {data_mb((service, keys, process)):.0f} MB")
    service.stop_all()


@pytest.fixture(scope="module")
def client(server):
    service, (key, _), _ = server
    return tinker.ServiceClient(base_url=service.base_url, api_key=key)


@pytest.fixture(scope="module")
def training(client):
    return client.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()


@pytest.fixture(scope="module")
def tokens(training) -> list[int]:
    return training.get_tokenizer().encode("What is 12+30? 42")


@pytest.fixture(scope="module")
def sampler_id(training) -> str:
    return training.save_weights_and_get_sampling_client().result()._sampling_session_id


def call(server, route: str, body=None, *, content: bytes | None = None, key: int = 0, method: str = "POST"):
    """A raw request as a tenant sends it; ``body`` is JSON with NaN and Infinity kept (json.dumps's)."""
    service, keys, _ = server
    headers = {"X-API-Key": keys[key]}
    if body is not None:
        content, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    elif content is not None:
        headers["Content-Type"] = "application/octet-stream"
    return httpx.request(method, f"{service.base_url}/api/v1/{route}", content=content, headers=headers, timeout=60)


def data_mb(server) -> float:
    status = Path(f"/proc/{server[2].proc.pid}/status").read_text()
    return int(re.search(r"VmData:\s+(\d+)", status).group(1)) / 1024


def resident_mb(server) -> float:
    status = Path(f"/proc/{server[2].proc.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def clean(server, response: httpx.Response, server_fault: bool = False) -> str:
    """The answer's text, after checking it is no 5xx and shows no traceback, exception, SQL or server path
    (the published model's directory aside: the SDK's get_tokenizer loads from it, docs/tinker.md)."""
    service = server[0]
    text = response.text.replace(DEMO_DIR, "<published model>")
    assert server_fault or response.status_code < 500, (response.status_code, text)
    assert "Traceback" not in text and 'File "' not in text, text
    assert not re.search(r"\b[A-Z]\w*(Error|Exception)\b", text), text  # a Python exception's name
    assert not re.search(r"\bSQL\b|sqlalchemy|sqlite|psycopg|INSERT INTO|SELECT ", text, re.I), text
    for path in (str(service.data_dir), str(Path.cwd()), sys.prefix, "/tmp/"):
        assert path not in text, (path, text)
    return text


def refused(server, response: httpx.Response, status: int, *needles: str) -> str:
    text = clean(server, response)
    assert response.status_code == status, (response.status_code, text)
    detail = response.json()["detail"]
    for needle in needles:
        assert needle in detail, (needle, detail)
    return detail


def fb_request(model_id: str, data: list[pb.Datum], loss_fn: str = "cross_entropy") -> bytes:
    return pb.ForwardBackwardRequest(model_id=model_id, seq_id=1, loss_fn=loss_fn, data=data).SerializeToString()


def wire_datum(tokens: list[int], **inputs: pb.Tensor) -> pb.Datum:
    chunk = pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=np.asarray(tokens, np.int32).tobytes()))
    return pb.Datum(model_input=[chunk], loss_fn_inputs=inputs)


def dense(values, dtype=pb.DTYPE_FLOAT32, shape=None) -> pb.Tensor:
    array = np.asarray(values, np.float32 if dtype == pb.DTYPE_FLOAT32 else np.int64)
    return pb.Tensor(dtype=dtype, dense=array.tobytes(), shape=list(array.shape) if shape is None else shape)


def good_datum(tokens: list[int]) -> pb.Datum:
    n = len(tokens) - 1
    return wire_datum(tokens[:-1], target_tokens=dense(tokens[1:], pb.DTYPE_INT64), weights=dense(np.ones(n)))


# 2: every request bounded before any work ------------------------------------------------------------------


def test_a_sparse_tensor_of_a_huge_declared_shape_is_refused_without_allocating_it(server, training, tokens):
    before = resident_mb(server)
    n = len(tokens) - 1
    huge = pb.Tensor(
        dtype=pb.DTYPE_INT32,
        shape=[2, 500_000_000],
        sparse_csr=pb.SparseCsr(crow_indices=np.zeros(3, np.int64).tobytes()),
    )
    body = fb_request(training.model_id, [wire_datum(tokens[:-1], target_tokens=huge, weights=dense(np.ones(n)))])
    assert len(body) < 400  # the 332-byte request
    response = call(server, "forward_backward", content=body)
    refused(server, response, 413, "target_tokens", "[2, 500000000]", "--tinker-max-sequence-tokens")
    assert resident_mb(server) - before < 100
    # a declared shape that overflows int64 once multiplied, and a negative one
    overflowing = pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2**40, 2**40], dense=b"")
    body = fb_request(
        training.model_id,
        [wire_datum(tokens[:-1], target_tokens=dense(tokens[1:], pb.DTYPE_INT64), weights=overflowing)],
    )
    refused(server, call(server, "forward_backward", content=body), 413, "weights")
    negative = pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[-4], dense=b"")
    body = fb_request(
        training.model_id, [wire_datum(tokens[:-1], target_tokens=dense(tokens[1:], pb.DTYPE_INT64), weights=negative)]
    )
    refused(server, call(server, "forward_backward", content=body), 400, "weights", "negative")


def test_a_hundred_thousand_samples_are_refused_and_the_server_serves_the_next_tenant(server, sampler_id, tokens):
    before = resident_mb(server)
    body = {
        "sampling_session_id": sampler_id,
        "num_samples": 100_000,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
        "sampling_params": {"max_tokens": 4},
    }
    refused(server, call(server, "asample", body), 413, "num_samples 100000", "--tinker-max-num-samples")
    assert resident_mb(server) - before < 100
    other = tinker.ServiceClient(base_url=server[0].base_url, api_key=server[1][1])
    started = time.monotonic()
    sampled = other.create_sampling_client(base_model=MODEL).result()
    result = sampled.sample(types.ModelInput.from_ints(tokens[:6]), 1, types.SamplingParams(max_tokens=6)).result()
    assert len(result.sequences[0].tokens) <= 6 and time.monotonic() - started < 60


def test_sample_requests_are_bounded(server, sampler_id, tokens):
    def sample(prompt: list[int], num_samples: int = 1, **params):
        body = {
            "sampling_session_id": sampler_id,
            "num_samples": num_samples,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
            "sampling_params": params,
        }
        return call(server, "asample", body)

    response = sample(tokens, max_tokens=1_000_000, stop=[])
    refused(server, response, 413, "max_tokens 1000000", "--tinker-max-sequence-tokens")
    long_prompt = (tokens * 20_000)[:100_000]  # a 100k-token prompt (about 500 kB of JSON)
    refused(server, sample(long_prompt, max_tokens=1), 413, "--tinker-max-sequence-tokens")
    # each within its own bound, together past the request's: 8 x (17 + 200) tokens
    refused(server, sample(tokens, 8, max_tokens=200), 413, "--tinker-max-sample-tokens")
    refused(server, sample(tokens, 0), 400, "num_samples 0")


def test_forward_backward_is_bounded_per_datum_and_per_call(server, training, tokens):
    long = (tokens * 2000)[:32_001]  # the 32k-token datum
    response = call(server, "forward_backward", content=fb_request(training.model_id, [good_datum(long)]))
    refused(server, response, 413, "data[0].model_input", "--tinker-max-sequence-tokens")
    each = (tokens * 20)[:201]  # 200 tokens a datum, 6 datums: 1200 tokens past the call's 1024
    response = call(server, "forward_backward", content=fb_request(training.model_id, [good_datum(each)] * 6))
    refused(server, response, 413, "--tinker-max-call-tokens")
    big = fb_request(training.model_id, [good_datum(tokens)] * 40_000)  # over the 1 MB every body may hold
    refused(server, call(server, "forward_backward", content=big), 413, "larger than the limit of 1048576 bytes")
    five = training.forward(
        [datum(each, target_tokens=each[1:], weights=np.ones(200, np.float32))] * 5, "cross_entropy"
    )
    assert len(five.result().loss_fn_outputs) == 5  # 1000 tokens: within the bound


# 3: tenants reach only published models --------------------------------------------------------------------


def test_tenants_name_only_published_models(server, client, training, tokens):
    session = client.holder.get_session_id()
    rest = tinker.RestClient(base_url=server[0].base_url, api_key=server[1][0])
    names = [m.model_name for m in rest.get_server_capabilities().result().supported_models]
    assert sorted(names) == sorted([MODEL, EXTRA, BROKEN, GONE])
    for name in (
        DEMO_DIR,
        "src/openrft/assets/demo_model",
        "./src/openrft/assets/demo_model",
        "../main",
        "",
        "Qwen/Qwen3-0.6B",
    ):
        body = {"session_id": session, "model_seq_id": 900, "base_model": name, "lora_config": {"rank": 4}}
        detail = refused(server, call(server, "create_model", body), 400, "base_model", MODEL, EXTRA)
        assert "tokenizer" not in detail.lower()
        body = {"session_id": session, "sampling_session_seq_id": 900, "base_model": name}
        refused(server, call(server, "create_sampling_session", body), 400, "base_model", MODEL, EXTRA)
    path = training.save_state("published").result().path
    body = {"session_id": session, "model_seq_id": 901, "path": path, "optimizer": False, "base_model": DEMO_DIR}
    refused(server, call(server, "load_weights", body), 400, "base_model", MODEL)
    # a name the operator published loads, under that name
    other = client.create_lora_training_client(base_model=EXTRA, rank=4, seed=0).result()
    assert other.get_info().model_name in (EXTRA, MODEL)  # one directory under two names: loaded once
    np.testing.assert_allclose(learner_logprobs(other, tokens), learner_logprobs(training, tokens), atol=1e-5)
    # load_weights' override: the checkpoint's own model under another published name, not another model
    body["base_model"] = EXTRA
    loaded = call(server, "retrieve_future", {"request_id": call(server, "load_weights", body).json()["request_id"]})
    assert clean(server, loaded) and loaded.json()["model_id"] == f"{session}:train:901"
    body |= {"base_model": BROKEN, "model_seq_id": 904}
    failed = call(server, "retrieve_future", {"request_id": call(server, "load_weights", body).json()["request_id"]})
    assert "is not the base model of" in clean(server, failed) and failed.json()["category"] == "user"
    # a published model that fails to load: the operator's problem, an error id for the tenant
    for name in (BROKEN, GONE):
        with pytest.raises(tinker.RequestFailedError, match=r"internal error err_\w+") as failure:
            client.create_lora_training_client(base_model=name, rank=4).result()
        assert str(server[0].data_dir.parent) not in str(failure.value)
    for name in (BROKEN, GONE):
        body = {"session_id": session, "sampling_session_seq_id": 905, "base_model": name}
        answer = call(server, "create_sampling_session", body)  # the operator's fault: 503 with an error id
        assert answer.status_code == 503 and re.search(r"internal error err_\w+", clean(server, answer, True))


# 4: numbers that cannot be trained with --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("learning_rate", float("nan")),
        ("learning_rate", float("inf")),
        ("learning_rate", -1.0),
        ("beta1", 1.0),
        ("beta2", float("nan")),
        ("eps", 0.0),
        ("eps", float("inf")),
        ("weight_decay", float("nan")),
        ("grad_clip_norm", float("-inf")),
    ],
)
def test_optimizer_values_that_cannot_train_are_refused_by_name(server, training, tokens, field, value):
    before = learner_logprobs(training, tokens)
    training.forward_backward(
        [datum(tokens, target_tokens=tokens[1:], weights=np.ones(len(tokens) - 1, np.float32))], "cross_entropy"
    ).result()
    body = {"model_id": training.model_id, "adam_params": {"learning_rate": 0.01, field: value}}
    refused(server, call(server, "optim_step", body), 400, f"optim_params.{field}")
    after = learner_logprobs(training, tokens)
    assert np.isfinite(after).all()
    np.testing.assert_array_equal(after, before)


def test_a_step_that_would_leave_the_adapter_non_finite_is_refused_and_undone(server, client, tokens):
    tc = client.create_lora_training_client(base_model=MODEL, rank=4, seed=1).result()
    n = len(tokens) - 1
    adam = types.AdamParams(learning_rate=0.01)
    tc.forward_backward([datum(tokens, target_tokens=tokens[1:], weights=np.ones(n, np.float32))], "cross_entropy")
    tc.optim_step(adam).result()
    before = learner_logprobs(tc, tokens)
    # a finite loss whose gradients square past float32: AdamW's second moment would be inf
    huge = datum(tokens, target_tokens=tokens[1:], weights=np.full(n, 1e30, np.float32))
    tc.forward_backward([huge], "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError, match=r"optim_step refused.*kept as they were"):
        tc.optim_step(adam).result()
    np.testing.assert_array_equal(learner_logprobs(tc, tokens), before)
    # an infinite loss accumulates no gradient
    inf = datum(tokens, target_tokens=tokens[1:], weights=np.full(n, 3e38, np.float32))
    with pytest.raises(tinker.RequestFailedError, match="not finite"):
        tc.forward_backward([inf], "cross_entropy").result()
    # and the client trains on as before
    tc.forward_backward([datum(tokens, target_tokens=tokens[1:], weights=np.ones(n, np.float32))], "cross_entropy")
    tc.optim_step(adam).result()
    after = learner_logprobs(tc, tokens)
    assert np.isfinite(after).all() and after.sum() > before.sum()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", -0.5),
        ("temperature", 1e-30),
        ("top_p", 0.0),
        ("top_p", float("nan")),
        ("top_p", 1.5),
        ("top_k", -5),
        ("top_k", 2**40),
        ("seed", 2**70),
        ("seed", -(2**70)),
    ],
)
def test_sampling_values_that_cannot_sample_are_refused_by_name(server, sampler_id, tokens, field, value):
    body = {
        "sampling_session_id": sampler_id,
        "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
        "sampling_params": {"max_tokens": 2, field: value},
    }
    detail = refused(server, call(server, "asample", body), 400, f"sampling_params.{field}")
    assert "diverged" not in detail and "Overflow" not in detail


# 5: no 500 and no library text -----------------------------------------------------------------------------


def test_malformed_requests_are_4xx_naming_the_field(server, training, sampler_id, tokens):
    refused(server, call(server, "create_session", content=b"not json"), 400, "body", "JSON")
    refused(server, call(server, "create_session", content=b'{"tags": [' + b"1" * 5000 + b"]}"), 400, "body")
    refused(server, call(server, "create_session", content=b"[" * 100_000), 400)
    refused(server, call(server, f"training_runs/{'x' * 2000}/checkpoints", method="GET"), 404, "training run")
    refused(server, call(server, f"training_runs/{'x' * 2000}", method="GET"), 404, "no training run")
    refused(server, call(server, f"copy_weights/{'x' * 2000}", method="GET"), 404, "not a route")
    refused(server, call(server, "retrieve_future", {"request_id": "r" * 2000}), 404, "no request")
    refused(server, call(server, f"samplers/{'s' * 2000}", method="GET"), 404, "no sampling session")
    refused(server, call(server, "get_info", {"model_id": "m" * 2000}), 404, "no training model")
    refused(server, call(server, "forward_backward", content=b"\xff" * 64), 400, "not a ForwardBackwardRequest")
    odd = pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=b"\x01\x02\x03"))
    body = fb_request(training.model_id, [pb.Datum(model_input=[odd])])
    refused(server, call(server, "forward_backward", content=body), 400, "data[0].model_input.chunks[0].tokens")
    bad_sparse = pb.Tensor(
        dtype=pb.DTYPE_INT64,
        shape=[1, 4],
        sparse_csr=pb.SparseCsr(
            values=np.ones(2, np.int64).tobytes(),
            crow_indices=np.asarray([0, 2], np.int64).tobytes(),
            col_indices=np.asarray([1, 9], np.int64).tobytes(),
        ),
    )
    body = fb_request(training.model_id, [wire_datum(tokens[:4], target_tokens=bad_sparse)])
    refused(server, call(server, "forward_backward", content=body), 400, "target_tokens.sparse_csr.col_indices")
    body = {"session_id": training.model_id.split(":")[0], "model_seq_id": 2**80, "base_model": MODEL}
    body["lora_config"] = {"rank": 4}
    refused(server, call(server, "create_model", body), 400, "model_seq_id")
    body = {"session_id": training.model_id.split(":")[0], "model_seq_id": 902, "base_model": MODEL}
    body["lora_config"] = {"rank": 4, "seed": 2**70}
    refused(server, call(server, "create_model", body), 400, "lora_config.seed")
    refused(server, call(server, "optim_step", {"model_id": training.model_id, "adam_params": "x" * 5000}), 400)


def test_a_server_side_failure_is_an_error_id_not_the_exception(server, training):
    path = training.save_state("to-corrupt").result().path
    model_id, _, name = path.removeprefix("tinker://").split("/")
    (server[0].data_dir / "tinker" / model_id / "weights" / name / "state.pt").write_bytes(b"not a torch file")
    session = training.model_id.split(":")[0]
    body = {"session_id": session, "model_seq_id": 903, "path": path, "optimizer": True}
    request_id = call(server, "load_weights", body).json()["request_id"]
    answer = call(server, "retrieve_future", {"request_id": request_id})
    text = clean(server, answer)
    assert answer.json()["category"] == "server"
    error_id = re.search(r"internal error (err_\w+)", text).group(1)
    assert error_id in server[2].log.read_text()  # the operator's log has it, with the traceback


# the checkpoint IntegrityError --------------------------------------------------------------------------------


def test_a_state_and_sampler_weights_saved_at_one_step(server, client, training, tokens):
    service, keys, _ = server
    state = training.save_state("final").result().path
    weights = training.save_weights_for_sampler("final").result().path
    again = training.save_weights_for_sampler("final-2").result().path
    listed = tinker.RestClient(base_url=service.base_url, api_key=keys[0]).list_checkpoints(training.model_id)
    paths = {c.tinker_path for c in listed.result().checkpoints}
    assert {state, weights, again} <= paths
    sampled = client.create_sampling_client(model_path=weights).result()
    assert sampled.sample(types.ModelInput.from_ints(tokens[:5]), 1, types.SamplingParams(max_tokens=2)).result()


# the fuzz test -------------------------------------------------------------------------------------------------

HOSTILE = [
    "",
    "/etc/passwd",
    "../../x",
    ".",
    "Qwen/Qwen3-0.6B",
    "tinker://a/weights/b",
    "tinker://../weights/x",
    "x" * 3000,
]
NUMBERS = st.one_of(
    st.integers(-3, 40),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 0.5, 1e-30, 2**31, 2**63, 2**64, 10**30]),
    st.none(),
    st.text(max_size=5),
)


def mostly(usual, other, share: int = 4):
    """``usual`` four times in five, else ``other`` (``st.one_of`` would weigh each of their branches alike)."""
    return st.integers(0, share).flatmap(lambda i: other if i == share else usual)


def fuzz_bodies(ids: dict[str, list[str]]):
    """Per route, a body with the route's fields drawn from valid and hostile values, or junk."""

    def pick(kind: str):
        return mostly(st.sampled_from(ids[kind]), st.one_of(st.sampled_from(HOSTILE), NUMBERS))

    def num(valid):
        return mostly(valid, NUMBERS)

    def body(required: dict, **optional):
        return mostly(st.fixed_dictionaries(required, optional=optional), st.one_of(st.binary(max_size=60), NUMBERS))

    tokens = st.lists(num(st.integers(0, 98)), min_size=1, max_size=12)  # the demo model's vocabulary: 99
    small = st.integers(1, 8)
    sampling = st.fixed_dictionaries(
        {},
        optional={
            "max_tokens": num(st.integers(1, 16)),
            "temperature": num(st.floats(0, 2)),
            "top_p": num(st.floats(0.1, 1)),
            "top_k": num(st.integers(-1, 50)),
            "seed": num(st.integers(0, 2**63)),
            "stop": st.one_of(
                st.none(),
                st.text(max_size=8),
                st.lists(st.one_of(st.integers(-5, 2**40), st.text(max_size=5)), max_size=70),
            ),
        },
    )
    adam = st.fixed_dictionaries(
        {},
        optional={
            "learning_rate": num(st.floats(0, 0.1)),
            "beta1": num(st.floats(0, 0.99)),
            "beta2": num(st.floats(0, 0.999)),
            "eps": num(st.floats(1e-12, 1e-6)),
            "weight_decay": num(st.floats(0, 0.1)),
            "grad_clip_norm": num(st.floats(0, 10)),
        },
    )
    lora = st.fixed_dictionaries(
        {"rank": num(st.integers(1, 8))}, optional={"seed": num(st.integers(0, 99)), "train_mlp": NUMBERS}
    )
    return {
        "create_session": body({}, tags=st.lists(st.text(max_size=5)), user_metadata=NUMBERS, sdk_version=NUMBERS),
        "create_model": body(
            {
                "session_id": pick("session"),
                "model_seq_id": num(st.integers(100, 10**6)),
                "base_model": pick("base"),
                "lora_config": lora,
            },
        ),
        "get_info": body({"model_id": pick("model")}),
        "optim_step": body({"model_id": pick("model"), "adam_params": adam}),
        "save_weights": body({"model_id": pick("model")}, path=pick("name"), overwrite=st.booleans()),
        "load_weights": body(
            {"path": pick("path"), "optimizer": st.booleans()},
            model_id=pick("model"),
            session_id=pick("session"),
            model_seq_id=num(st.integers(100, 10**6)),
            base_model=pick("base"),
        ),
        "save_weights_for_sampler": body({"model_id": pick("model")}, path=pick("name")),
        "create_sampling_session": body(
            {"session_id": pick("session"), "sampling_session_seq_id": num(st.integers(0, 99))},
            base_model=pick("base"),
            model_path=pick("path"),
        ),
        "asample": body(
            {
                "sampling_session_id": pick("sampler"),
                "num_samples": num(small),
                "prompt": st.builds(lambda t: {"chunks": [{"type": "encoded_text", "tokens": t}]}, tokens),
                "sampling_params": sampling,
            },
            prompt_logprobs=st.booleans(),
            topk_prompt_logprobs=NUMBERS,
        ),
        "retrieve_future": body({"request_id": pick("request")}),
        "session_heartbeat": body({"session_id": pick("session")}),
    }


def fuzz_tensor():
    def build(dtype, shape, values, sparse, crow):
        if not sparse:
            return pb.Tensor(dtype=dtype, shape=shape, dense=values)
        csr = pb.SparseCsr(values=values, crow_indices=np.asarray(crow, np.int64).tobytes(), col_indices=values[::-1])
        return pb.Tensor(dtype=dtype, shape=shape, sparse_csr=csr)

    return st.builds(
        build,
        st.sampled_from([pb.DTYPE_FLOAT32, pb.DTYPE_INT64, pb.DTYPE_INT32, 0, 4, 99]),
        st.one_of(st.lists(st.integers(-3, 20), max_size=3), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)),
        st.one_of(st.binary(max_size=80), st.builds(lambda n: np.ones(n, np.float32).tobytes(), st.integers(0, 20))),
        st.booleans(),
        st.lists(st.integers(-2, 30), max_size=4),
    )


def fuzz_forward_backward(model_ids: list[str]):
    token_bytes = st.one_of(
        st.builds(lambda t: np.asarray(t, np.int32).tobytes(), st.lists(st.integers(-5, 300), min_size=1, max_size=20)),
        st.binary(max_size=30),
    )
    random_datum = st.builds(
        lambda chunks, inputs: pb.Datum(
            model_input=[pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=c)) for c in chunks], loss_fn_inputs=inputs
        ),
        st.lists(token_bytes, max_size=2),
        st.dictionaries(
            st.sampled_from(["target_tokens", "weights", "advantages", "logprobs", "x"]), fuzz_tensor(), max_size=3
        ),
    )

    def shaped(tokens: list[int], values: list[float], loss: str) -> pb.Datum:
        n = len(tokens) - 1
        weights = dense((values * n)[:n])
        inputs = {"target_tokens": dense(tokens[1:], pb.DTYPE_INT64)}
        if loss == "cross_entropy":
            inputs["weights"] = weights
        else:
            inputs |= {"logprobs": dense(-np.abs(weights_of(weights))), "advantages": weights}
        return wire_datum(tokens[:-1], **inputs)

    losses = st.sampled_from(["cross_entropy", "ppo", "importance_sampling", "dro", "cispo"])

    def message(model_id, loss_fn, data, config, only) -> bytes:
        return pb.ForwardBackwardRequest(
            model_id=model_id, seq_id=1, loss_fn=loss_fn, data=data, loss_fn_config=config, forward_only=only
        ).SerializeToString()

    valid = st.builds(
        lambda model_id, loss, datums, only: message(model_id, loss, [shaped(t, v, loss) for t, v in datums], {}, only),
        st.sampled_from(model_ids),
        losses,
        st.lists(
            st.tuples(
                st.lists(st.integers(0, 98), min_size=2, max_size=30),
                st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=3),
            ),
            min_size=1,
            max_size=3,
        ),
        st.booleans(),
    )
    randomized = st.builds(
        message,
        st.sampled_from(model_ids),
        st.sampled_from(["cross_entropy", "ppo", "importance_sampling", "dro", "gspo", ""]),
        st.lists(random_datum, max_size=3),
        st.dictionaries(
            st.sampled_from(["clip_low_threshold", "clip_high_threshold", "beta", "x"]), st.floats(width=32)
        ),
        st.booleans(),
    )
    return mostly(valid, st.one_of(randomized, st.binary(max_size=200)), share=2)


def weights_of(tensor: pb.Tensor) -> np.ndarray:
    return np.frombuffer(tensor.dense, np.float32)


def test_fuzzed_requests_get_no_5xx_and_no_library_text(server, client, sampler_id):
    """A corpus of fuzzed requests to every Tinker route, as either tenant: JSON bodies whose fields are drawn
    from valid ids and values and hostile ones (NaN, huge integers, paths, long strings), protobuf
    forward_backward bodies with random shapes, dtypes and sparse parts, non-JSON bodies, and random path ids.
    None answers 5xx or shows a traceback, an exception's name, SQL or a server path, nor does any future it
    queued. Bounded: 300 examples, derandomized (the same corpus each run), well under two minutes."""
    fuzzed = client.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()
    state = fuzzed.save_state("fuzzed").result().path
    ids = {
        "session": [client.holder.get_session_id()],
        "model": [fuzzed.model_id],
        "sampler": [sampler_id],
        "path": [state, state.replace("/weights/", "/sampler_weights/")],
        "name": ["fuzzed", "other-name"],
        "base": [MODEL, EXTRA, DEMO_DIR],
        "request": ["req_0"],
    }
    bodies = fuzz_bodies(ids)
    path_routes = ("sessions/{id}/finish", "training_runs/{id}/checkpoints", "samplers/{id}", "training_runs/{id}")
    known = [v for kind, vs in ids.items() if kind != "session" for v in vs]  # finishing it would end the fuzzing
    path_ids = st.one_of(st.sampled_from(known), st.text(min_size=1, max_size=300))
    started = time.monotonic()
    statuses: dict[int, int] = {}

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    )
    @given(
        route=st.sampled_from([*bodies, *path_routes, "forward_backward", "forward_backward"]),
        data=st.data(),
        key=st.sampled_from([0, 0, 1]),
    )
    def one(route, data, key):
        if route == "forward_backward":
            response = call(server, route, content=data.draw(fuzz_forward_backward([fuzzed.model_id, "nope"])), key=key)
        elif route in path_routes:
            path = route.replace("{id}", quote(data.draw(path_ids), safe=""))
            response = call(server, path, method="POST" if route.endswith("finish") else "GET", key=key)
        else:
            body = data.draw(bodies[route])
            is_bytes = isinstance(body, bytes)
            response = call(server, route, None if is_bytes else body, content=body if is_bytes else None, key=key)
        clean(server, response)
        if os.environ.get("FUZZ_DEBUG"):
            print("ANSWER", route, response.status_code, response.text[:100])
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        request_id = response.json().get("request_id") if response.status_code == 200 else None
        if isinstance(request_id, str):
            answer = call(server, "retrieve_future", {"request_id": request_id}, key=key)
            clean(server, answer)
            if os.environ.get("FUZZ_DEBUG"):
                print("FUTURE", route, answer.text[:160])

    one()
    print(f"fuzzed Tinker routes: answers by status {dict(sorted(statuses.items()))}")
    assert time.monotonic() - started < 120
    assert statuses.get(200, 0) > 50 and statuses.get(400, 0) > 50, statuses  # both the work and the refusals reached
    assert httpx.get(server[0].base_url + "/health").status_code == 200
