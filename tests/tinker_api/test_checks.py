"""The Tinker API's checks without a server process: published models (and the local operator's paths),
the operator's bounds as ``openrft serve`` options, and how the wire reader bounds and validates tensors."""

from __future__ import annotations

import argparse
import re
import time

import numpy as np
import pytest

pytest.importorskip("tinker")
from fastapi.testclient import TestClient
from tinker.proto import tinker_public_pb2 as pb

from openrft.cli.tinker_options import add_tinker_options, tinker_settings
from openrft.errors import OpenRFTError
from openrft.models import REGISTERED_MODELS
from openrft.service.auth import LOCAL_OWNER
from openrft.service.tinker import checks
from openrft.service.tinker.settings import TinkerSettings
from openrft.service.tinker.wire import WireError, _tensor

DEMO_DIR = str(REGISTERED_MODELS["openrft-demo"])


def test_tenants_name_published_models_and_the_local_operator_any():
    settings = TinkerSettings(models={"mine": "/models/mine"})
    assert checks.base_model(settings, "key-1", "mine") == "mine"
    for name in (DEMO_DIR, "src/openrft/assets/demo_model", "../x", "~/m", "", "Qwen/Qwen3-0.6B", None, 7):
        with pytest.raises(checks.Refused, match=r"available: mine, openrft-demo$"):
            checks.base_model(settings, "key-1", name)
    assert checks.base_model(settings, LOCAL_OWNER, DEMO_DIR) == DEMO_DIR  # loopback, no API keys
    hub = TinkerSettings(allow_hub_models=True)
    assert checks.base_model(hub, "key-1", "Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    for name in (DEMO_DIR, "src/openrft", "./a/b", "a/../b", "org/name/extra", ".hidden/x"):  # paths stay refused
        with pytest.raises(checks.Refused, match="or a Hugging Face Hub id"):
            checks.base_model(hub, "key-1", name)


def parse(*argv: str) -> TinkerSettings:
    parser = argparse.ArgumentParser()
    add_tinker_options(parser)
    return tinker_settings(parser.parse_args(list(argv)))


def test_the_bounds_and_models_are_serve_options(tmp_path):
    assert parse() == TinkerSettings()
    assert (TinkerSettings().max_sequence_tokens, TinkerSettings().max_num_samples) == (8192, 128)
    settings = parse(
        *("--tinker-max-sequence-tokens", "512", "--tinker-max-call-tokens", "2048"),
        *("--tinker-max-num-samples", "4", "--tinker-max-sample-tokens", "999"),
        *("--model", f"local={tmp_path}", "--model", "Org/Hub-Model", "--allow-hub-models"),
    )
    assert (settings.max_sequence_tokens, settings.max_call_tokens) == (512, 2048)
    assert (settings.max_num_samples, settings.max_sample_tokens) == (4, 999)
    assert settings.models == {"local": str(tmp_path.resolve()), "Org/Hub-Model": "Org/Hub-Model"}
    assert settings.allow_hub_models
    assert checks.published(settings)["local"] == str(tmp_path.resolve())
    with pytest.raises(OpenRFTError, match="--tinker-max-num-samples 0: must be at least 1"):
        parse("--tinker-max-num-samples", "0")
    with pytest.raises(OpenRFTError, match="is not a directory"):
        parse("--model", f"gone={tmp_path / 'gone'}")
    with pytest.raises(OpenRFTError, match="NAME other than openrft-demo"):
        parse("--model", f"openrft-demo={tmp_path}")


def sparse(shape, values, crow, col, dtype=pb.DTYPE_INT64) -> pb.Tensor:
    csr = pb.SparseCsr(
        values=np.asarray(values, np.int64).tobytes(),
        crow_indices=np.asarray(crow, np.int64).tobytes(),
        col_indices=np.asarray(col, np.int64).tobytes(),
    )
    return pb.Tensor(dtype=dtype, shape=shape, sparse_csr=csr)


def test_sparse_tensors_are_densified_within_the_bound_and_checked():
    settings = TinkerSettings(max_sequence_tokens=16)
    dense = _tensor(sparse([2, 3], [5, 6, 7], [0, 1, 3], [2, 0, 1]), "t", 16, settings)
    assert dense.tolist() == [[0, 0, 5], [6, 7, 0]]
    started = time.perf_counter()
    with pytest.raises(WireError, match=r"declares shape \[2, 500000000\]") as refused:
        _tensor(sparse([2, 500_000_000], [], [0, 0, 0], []), "t", 16, settings)
    assert refused.value.status == 413 and time.perf_counter() - started < 0.1
    with pytest.raises(WireError, match="declares") as refused:
        _tensor(sparse([2**40, 2**40], [], [], []), "t", 16, settings)  # the product overflows int64
    bad = {
        "crow_indices must be 3 non-decreasing": sparse([2, 3], [1], [0, 1], [0]),
        "crow_indices must be 3 non-decreasing ": sparse([2, 3], [1], [0, 2, 1], [0]),
        "the three must agree": sparse([2, 3], [1, 2], [0, 1, 1], [0]),
        r"col_indices holds a column outside \[0, 3\)": sparse([2, 3], [1], [0, 1, 1], [3]),
        "must have two dimensions": sparse([6], [1], [0, 1], [0]),
        "none negative": sparse([-2, 3], [], [0], []),
    }
    for message, tensor in bad.items():
        with pytest.raises(WireError, match=message.strip()):
            _tensor(tensor, "t", 16, settings)
    with pytest.raises(WireError, match="not a whole number of float32 values"):
        _tensor(pb.Tensor(dtype=pb.DTYPE_FLOAT32, dense=b"\x00" * 7), "t", 16, settings)
    with pytest.raises(WireError, match="holds 17 values") as refused:
        _tensor(pb.Tensor(dtype=pb.DTYPE_FLOAT32, dense=np.ones(17, np.float32).tobytes()), "t", 16, settings)
    assert refused.value.status == 413


def test_the_local_operator_may_train_a_model_directory(tmp_path):
    """On loopback with no API keys the one user is the operator (tenancy.is_operator): paths still load."""
    from openrft.service.app import create_app
    from openrft.service.config import ServiceConfig
    from openrft.service.store import Store

    config = ServiceConfig.build(tmp_path, f"sqlite:///{tmp_path / 'openrft.db'}")
    store = Store.open(config.database_url)
    try:
        with TestClient(create_app(config, store)) as http:
            headers = {"X-API-Key": "tml-local"}
            opening = {"tags": [], "user_metadata": {}, "sdk_version": "x"}
            session = http.post("/api/v1/create_session", json=opening, headers=headers)
            body = {"session_id": session.json()["session_id"], "model_seq_id": 0, "base_model": DEMO_DIR}
            created = http.post("/api/v1/create_model", json={**body, "lora_config": {"rank": 2}}, headers=headers)
            assert created.status_code == 200, created.text
            request_id = created.json()["request_id"]
            answer = http.post("/api/v1/retrieve_future", json={"request_id": request_id}, headers=headers).json()
            assert answer["model_id"] == created.json()["model_id"] and "error" not in answer
    finally:
        store.close()


def test_a_database_error_on_a_tinker_route_is_an_error_id_without_sql(tmp_path, caplog):
    from sqlalchemy.exc import OperationalError

    from openrft.service.app import create_app
    from openrft.service.config import ServiceConfig
    from openrft.service.store import Store

    config = ServiceConfig.build(tmp_path, f"sqlite:///{tmp_path / 'openrft.db'}")
    store = Store.open(config.database_url)
    try:
        app = create_app(config, store)

        def down(credential):
            raise OperationalError("SELECT api_keys.id FROM api_keys WHERE key_hash = ?", {}, Exception("locked"))

        app.state.tinker.owners.owner = down
        with TestClient(app, raise_server_exceptions=False) as http:
            answer = http.post("/api/v1/get_info", json={"model_id": "m"}, headers={"X-API-Key": "tml-x"})
        assert answer.status_code == 500
        error_id = re.search(r"internal server error (err_\w+)", answer.json()["detail"]).group(1)
        assert "SELECT" not in answer.text and "OperationalError" not in answer.text
        assert error_id in caplog.text and "OperationalError" in caplog.text
    finally:
        store.close()


def test_stop_strings_cut_where_one_token_at_a_time_would():
    from types import SimpleNamespace

    from openrft.models import load_tokenizer
    from openrft.service.tinker.engine import _cut_at_stop_strings

    tokenizer = load_tokenizer("openrft-demo")
    rng = np.random.default_rng(0)

    def one_at_a_time(tokens, stops):
        for end in range(1, len(tokens) + 1):
            if any(s in tokenizer.decode(tokens[:end]) for s in stops):
                return end
        return None

    for _ in range(200):
        tokens = rng.integers(0, tokenizer.vocab_size, int(rng.integers(1, 40))).tolist()
        text = tokenizer.decode(tokens)
        start = int(rng.integers(0, max(1, len(text))))
        stops = [text[start : start + int(rng.integers(1, 4))] or "x", "never-there"]
        completion = SimpleNamespace(token_ids=tokens, logprobs=[0.0] * len(tokens), finish_reason="length")
        cut = _cut_at_stop_strings(completion, stops, tokenizer)
        expected = one_at_a_time(tokens, stops)
        assert len(cut.tokens) == (expected or len(tokens)) and cut.stopped == (expected is not None)
