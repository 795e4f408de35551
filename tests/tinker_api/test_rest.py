"""The official SDK's ``RestClient`` (0.38) against a real ``openrft serve``: training runs, sessions and
checkpoints listed, fetched, deleted (files and rows), published, given a TTL and exported for download, each
of its key's tenant (another tenant's read as not found), with no database text in any answer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

tinker = pytest.importorskip("tinker")
from safetensors.torch import load_file  # noqa: E402
from sqlalchemy import select, text  # noqa: E402
from tinker import types  # noqa: E402

from openrft.service.store import Store  # noqa: E402
from openrft.service.store.models import Checkpoint  # noqa: E402
from tests.service.svc_helpers import CLI, Service  # noqa: E402

MODEL = "openrft-demo"
SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE FROM|sqlite3?|IntegrityError|OperationalError|Traceback)\b", re.I)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    os.environ["TINKER_TELEMETRY"] = "0"
    root = tmp_path_factory.mktemp("tinker_rest")
    service = Service(root, f"sqlite:///{root / 'openrft.db'}", env={"HF_HUB_OFFLINE": "1"})
    where = [f"--data-dir={root}", f"--database-url={service.database_url}"]
    keys = []
    for name in ("a", "b"):
        created = subprocess.run(
            [sys.executable, "-c", CLI, "keys", "create", "--tinker", "--name", name, *where],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        keys.append(created.stdout.strip())
    service.wait_healthy(service.serve(workers=0, wait=False), timeout=400)
    yield service, keys, root
    service.stop_all()


@pytest.fixture(scope="module")
def clients(server):
    service, keys, _ = server
    return [tinker.ServiceClient(base_url=service.base_url, api_key=key) for key in keys]


@pytest.fixture(scope="module")
def rests(server):
    service, keys, _ = server
    return [tinker.RestClient(base_url=service.base_url, api_key=key) for key in keys]


@pytest.fixture(scope="module")
def trained(clients):
    """Three training clients of tenant a in one session, the last one stepped once."""
    metadata = [{"renderer_name": "role_colon"}, None, None]  # as the cookbook's training loops tag their runs
    made = [
        clients[0].create_lora_training_client(base_model=MODEL, rank=4, seed=i, user_metadata=metadata[i]).result()
        for i in range(3)
    ]
    tokens = made[-1].get_tokenizer().encode("What is 12+30? 42")
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    made[-1].forward_backward([datum], "cross_entropy").result()
    made[-1].optim_step(types.AdamParams(learning_rate=1e-3)).result()
    return made


def raw(server, method: str, path: str, key: int = 0, **kwargs) -> httpx.Response:
    service, keys, _ = server
    answer = httpx.request(method, service.base_url + path, headers={"X-API-Key": keys[key]}, timeout=60, **kwargs)
    assert answer.status_code < 500 or "internal error err_" in answer.text, answer.text
    assert not SQL.search(answer.text), answer.text  # no database text in any answer
    return answer


def on_disk(root: Path, tinker_path: str) -> Path:
    model_id, kind, name = tinker_path[len("tinker://") :].split("/")
    return root / "tinker" / model_id / kind / name


def rows(service, tinker_path: str) -> list[str]:
    store = Store.open(service.database_url)
    try:
        with store.session() as s:
            return list(s.scalars(select(Checkpoint.id).where(Checkpoint.path == tinker_path)))
    finally:
        store.close()


def test_training_runs_and_sessions_page_and_belong_to_their_tenant(server, clients, rests, trained):
    mine, theirs = rests
    ids = [tc.model_id for tc in trained]
    first = mine.list_training_runs(limit=2).result()
    second = mine.list_training_runs(limit=2, offset=2).result()
    assert first.cursor.total_count == second.cursor.total_count == 3
    assert (first.cursor.offset, first.cursor.limit, second.cursor.offset) == (0, 2, 2)
    assert [r.training_run_id for r in first.training_runs + second.training_runs] == ids[::-1]  # newest first

    assert mine.get_training_run(ids[0]).result().user_metadata == {"renderer_name": "role_colon"}
    run = mine.get_training_run(ids[-1]).result()
    assert (run.training_run_id, run.base_model, run.is_lora, run.lora_rank) == (ids[-1], MODEL, True, 4)
    assert run.last_checkpoint is None and run.last_sampler_checkpoint is None
    path = trained[-1].save_state("rest-run").result().path
    by_path = mine.get_training_run_by_tinker_path(path).result()
    assert by_path.training_run_id == ids[-1] and by_path.last_checkpoint.tinker_path == path

    session = ids[0].split(":")[0]
    assert session in mine.list_sessions().result().sessions
    assert mine.get_session(session).result().training_run_ids == ids
    snapshot = trained[-1].save_weights_and_get_sampling_client().result()  # a sampler of that session
    sampler_id = snapshot._sampling_session_id
    assert sampler_id in mine.get_session(session).result().sampler_ids

    # another tenant: nothing listed, each id not found
    assert theirs.list_training_runs().result().cursor.total_count == 0
    assert session not in theirs.list_sessions().result().sessions
    for call in (
        lambda: theirs.get_training_run(ids[0]),
        lambda: theirs.get_training_run_by_tinker_path(path),
        lambda: theirs.get_session(session),
        lambda: theirs.list_checkpoints(ids[-1]),
    ):
        with pytest.raises(tinker.NotFoundError):
            call().result()
    session_body = {"session_id": clients[0].holder.get_session_id(), "model_seq_id": 900, "base_model": MODEL}
    for metadata, needle in (({"a": 1}, "user_metadata['a'] = 1"), ({"k": "v" * 1025}, "at most 1024")):
        body = session_body | {"lora_config": {"rank": 4}, "user_metadata": metadata}
        bad = raw(server, "POST", "/api/v1/create_model", json=body)
        assert bad.status_code == 400 and needle in bad.json()["detail"], bad.text
    bad = raw(server, "GET", "/api/v1/training_runs", params={"limit": 0})
    assert bad.status_code == 400 and "limit 0 must be in [1, 1000]" in bad.json()["detail"]
    bad = raw(server, "GET", "/api/v1/sessions", params={"access_scope": "everyone"})
    assert bad.status_code == 400 and "access_scope 'everyone'" in bad.json()["detail"]


def test_checkpoints_listed_deleted_with_their_files_and_rows_per_tenant(server, rests, trained):
    service, _, root = server
    mine, theirs = rests
    tc = trained[0]
    state = tc.save_state("final").result().path
    weights = tc.save_weights_for_sampler("final").result().path  # the same step: both kept
    listed = mine.list_checkpoints(tc.model_id).result().checkpoints
    assert [(c.checkpoint_type, c.checkpoint_id, c.tinker_path) for c in listed] == [
        ("training", "weights/final", state),
        ("sampler", "sampler_weights/final", weights),
    ]
    assert all(c.size_bytes > 0 and not c.public and c.expires_at is None for c in listed)
    everything = mine.list_user_checkpoints(limit=1).result()
    assert everything.cursor.total_count >= 2 and len(everything.checkpoints) == 1
    assert everything.checkpoints[0].tinker_path == weights  # newest first
    assert theirs.list_user_checkpoints().result().checkpoints == []

    # another tenant cannot delete it: not found, and nothing is touched
    with pytest.raises(tinker.NotFoundError):
        theirs.delete_checkpoint_from_tinker_path(state).result()
    assert on_disk(root, state).is_dir() and rows(service, state)

    mine.delete_checkpoint_from_tinker_path(state).result()
    assert not on_disk(root, state).exists() and rows(service, state) == []
    assert not any(p.name.startswith(".final") for p in on_disk(root, state).parent.iterdir())  # no leftovers
    assert [c.tinker_path for c in mine.list_checkpoints(tc.model_id).result().checkpoints] == [weights]
    with pytest.raises(tinker.NotFoundError):
        mine.delete_checkpoint(tc.model_id, "weights/final").result()  # gone: not found the second time
    with pytest.raises(Exception, match="no checkpoint"):
        tinker.ServiceClient(base_url=service.base_url, api_key=server[1][0]).create_training_client_from_state(
            state
        ).result()
    mine.delete_checkpoint(tc.model_id, "sampler_weights/final").result()  # by run and checkpoint id
    assert not on_disk(root, weights).exists() and rows(service, weights) == []
    assert mine.list_checkpoints(tc.model_id).result().checkpoints == []  # the run is still there, empty


def test_a_published_checkpoint_is_read_by_another_tenant_never_changed(server, clients, rests, trained):
    mine, theirs = rests
    path = trained[1].save_weights_for_sampler("shared").result().path
    with pytest.raises(Exception, match="no checkpoint"):
        clients[1].create_sampling_client(model_path=path).result()
    mine.publish_checkpoint_from_tinker_path(path).result()
    assert [c.public for c in mine.list_checkpoints(trained[1].model_id).result().checkpoints] == [True]
    sampler = clients[1].create_sampling_client(model_path=path).result()  # read by the other tenant
    assert sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2)).result()
    assert theirs.get_weights_info_by_tinker_path(path).result().lora_rank == 4
    for call in (
        theirs.unpublish_checkpoint_from_tinker_path,
        theirs.delete_checkpoint_from_tinker_path,
        lambda p: theirs.set_checkpoint_ttl_from_tinker_path(p, 3600),
    ):
        with pytest.raises(tinker.NotFoundError):
            call(path).result()
    assert theirs.list_user_checkpoints().result().checkpoints == []  # read by path, never listed
    mine.unpublish_checkpoint_from_tinker_path(path).result()
    with pytest.raises(Exception, match="no checkpoint"):
        clients[1].create_sampling_client(model_path=path).result()
    with pytest.raises(tinker.NotFoundError):
        theirs.get_weights_info_by_tinker_path(path).result()


def test_a_ttl_expires_a_checkpoint_and_out_of_range_is_refused_by_name(server, clients, rests, trained):
    _, _, root = server
    mine = rests[0]
    tc = trained[2]
    path = tc.save_state("rolling", ttl_seconds=7200).result().path
    (listed,) = [c for c in mine.list_checkpoints(tc.model_id).result().checkpoints if c.tinker_path == path]
    assert abs(listed.expires_at.timestamp() - (time.time() + 7200)) < 120
    mine.set_checkpoint_ttl_from_tinker_path(path, None).result()
    (listed,) = [c for c in mine.list_checkpoints(tc.model_id).result().checkpoints if c.tinker_path == path]
    assert listed.expires_at is None
    for ttl in (3599, 10 * 365 * 86400 + 1):
        answer = raw(
            server,
            "PUT",
            f"/api/v1/training_runs/{tc.model_id}/checkpoints/weights/rolling/ttl",
            json={"ttl_seconds": ttl},
        )
        assert answer.status_code == 400 and f"ttl_seconds {ttl} must be an integer in [3600, " in answer.text
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds 60"):
        tc.save_state("too-short", ttl_seconds=60).result()
    mine.set_checkpoint_ttl_from_tinker_path(path, 3600).result()
    meta = on_disk(root, path) / "meta.json"  # an hour later, as the server sees it
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "expires_at": time.time() - 1}))
    with pytest.raises(Exception, match="no checkpoint"):
        clients[0].create_training_client_from_state(path).result()
    assert path not in [c.tinker_path for c in mine.list_checkpoints(tc.model_id).result().checkpoints]
    assert not on_disk(root, path).exists()  # removed when found expired


def test_external_weights_download_by_signed_url_without_the_key(server, rests, trained):
    _, _, root = server
    mine, theirs = rests
    tc = trained[2]
    path = tc.save_weights_external("export").result().path
    assert path == f"tinker://{tc.model_id}/external_weights/export"
    urls = mine.get_external_weights_urls(path).result()
    assert set(urls.urls) == {"adapter_model.safetensors", "adapter_config.json"}
    with pytest.raises(tinker.NotFoundError):
        theirs.get_external_weights_urls(path).result()
    config = httpx.get(urls.urls["adapter_config.json"], timeout=60)  # a plain GET, no key
    assert config.status_code == 200 and config.json()["r"] == 4 and config.json()["base_model_name_or_path"] == MODEL
    weights = httpx.get(urls.urls["adapter_model.safetensors"], timeout=60)
    file = root / "downloaded.safetensors"
    file.write_bytes(weights.content)
    adapter = load_file(str(file))
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    kinds = {c.tinker_path: c.checkpoint_type for c in mine.list_checkpoints(tc.model_id).result().checkpoints}
    assert kinds[path] == "external"

    forged = urls.urls["adapter_config.json"][:-4] + "0000"
    assert httpx.get(forged, timeout=60).status_code == 404
    mine.delete_checkpoint_from_tinker_path(path).result()
    gone = httpx.get(urls.urls["adapter_config.json"], timeout=60)
    assert gone.status_code == 404 and "deleted or has expired" in gone.text
    assert not on_disk(root, path).exists()


def test_a_database_failure_answers_an_error_id_and_keeps_the_checkpoint(server, trained):
    service, _, root = server
    tc = trained[1]
    path = tc.save_state("kept").result().path
    store = Store.open(service.database_url)
    try:
        with store.session() as s:
            s.execute(text("ALTER TABLE checkpoints RENAME TO checkpoints_away"))
        answer = raw(server, "DELETE", f"/api/v1/training_runs/{tc.model_id}/checkpoints/weights/kept")
    finally:
        with store.session() as s:
            s.execute(text("ALTER TABLE checkpoints_away RENAME TO checkpoints"))
        store.close()
    assert answer.status_code == 503 and re.search(r"internal error err_\w+", answer.text), answer.text
    assert "checkpoints_away" not in answer.text
    assert on_disk(root, path).is_dir() and rows(service, path)  # nothing changed
    for route in ("/api/v1/training_runs/x/checkpoints/weights/..%2Fetc", "/api/v1/training_runs/%00/checkpoints"):
        assert raw(server, "GET" if route.endswith("checkpoints") else "DELETE", route).status_code == 404


HOSTILE = ["", "/etc/passwd", "../../x", ".", "..", "tinker://a/weights/b", "%00", "x" * 3000, "sess_x:train:0"]


def test_hostile_ids_on_every_rest_route_are_4xx_without_server_text(server, trained):
    """Every route of the RestClient with hostile ids, names, bodies and query values, as either tenant: no 5xx,
    no traceback, exception name, SQL or server path in any answer."""
    _, _, root = server
    run = trained[0].model_id
    quoted = [quote(h, safe="") for h in HOSTILE if h not in (".", "..")]  # a client resolves those itself
    calls = [("GET", "/api/v1/training_runs", {"params": {"limit": v}}) for v in ("x", -1, 10**30, 1001)]
    calls += [("GET", "/api/v1/checkpoints", {"params": {"offset": v}}) for v in ("x", -1)]
    calls += [("POST", "/api/v1/weights_info", {"json": {"tinker_path": h}}) for h in HOSTILE]
    calls += [("POST", "/api/v1/weights_info", {"content": b"[" * 5000})]
    body = {"model_id": run, "path": "../x", "ttl_seconds": 10}
    calls += [
        ("POST", "/api/v1/save_weights_external", {"json": body | {k: v}})
        for k, v in (("path", "ok"), ("model_id", "x"), ("age_encryption_recipients", ["age1x"]))
    ]
    for q in quoted:
        calls += [("GET", f"/api/v1/training_runs/{q}", {}), ("GET", f"/api/v1/sessions/{q}", {})]
        calls += [("GET", f"/api/v1/training_runs/{q}/checkpoints", {}), ("GET", f"/api/v1/checkpoint_files/{q}", {})]
        for where in (f"{q}/checkpoints/weights/x", f"{run}/checkpoints/weights/{q}", f"{run}/checkpoints/{q}/x"):
            calls += [("DELETE", f"/api/v1/training_runs/{where}", {})]
            calls += [(m, f"/api/v1/training_runs/{where}/publish", {}) for m in ("POST", "DELETE")]
            calls += [("PUT", f"/api/v1/training_runs/{where}/ttl", {"json": {"ttl_seconds": 3600}})]
            calls += [("GET", f"/api/v1/training_runs/{where}/external_weights_urls", {})]
    calls += [
        ("PUT", f"/api/v1/training_runs/{run}/checkpoints/weights/x/ttl", {"json": {"ttl_seconds": v}})
        for v in ("x", 1.5, 2**70, True)
    ]
    statuses = set()
    for i, (method, path, kwargs) in enumerate(calls):
        answer = raw(server, method, path, key=i % 2, **kwargs)
        statuses.add(answer.status_code)
        assert 400 <= answer.status_code < 500, (method, path, answer.status_code, answer.text)
        text = answer.text
        assert not re.search(r"\b[A-Z]\w*(Error|Exception)\b|Traceback|File \"", text), text
        assert str(root) not in text and "/tmp/" not in text, text
    assert {400, 404} <= statuses, statuses
