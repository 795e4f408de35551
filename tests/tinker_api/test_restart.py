"""A Tinker training client as a job of its tenant in the store and on the dashboard, and resumed from its
saved state by a restarted ``openrft serve`` (the official SDK, a real server on 127.0.0.1)."""

from __future__ import annotations

import os

import httpx
import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from openrft.service.store import Store  # noqa: E402
from tests.service.svc_helpers import Service  # noqa: E402
from tests.tinker_api.test_sdk import MODEL, datum, learner_logprobs  # noqa: E402


def dashboard(service: Service, key: str, path: str = "") -> httpx.Response:
    return httpx.get(f"{service.base_url}/v1/dashboard/jobs{path}", headers={"Authorization": f"Bearer {key}"})


def test_a_training_client_is_a_job_on_the_dashboard_and_resumes_after_a_restart(tmp_path):
    os.environ["TINKER_TELEMETRY"] = "0"
    service = Service(tmp_path, f"sqlite:///{tmp_path / 'openrft.db'}", env={"HF_HUB_OFFLINE": "1"})
    store = Store.open(service.database_url)
    mine, other = (store.create_key(name)[1] for name in ("a", "b"))
    store.close()
    try:
        service.wait_healthy(service.serve(workers=0, wait=False), timeout=400)
        client = tinker.ServiceClient(base_url=service.base_url, api_key="tml-" + mine)
        tc = client.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()
        tokens = tc.get_tokenizer().encode("What is 12+30? 42")
        d = datum(tokens, target_tokens=tokens[1:], weights=np.ones(len(tokens) - 1, np.float32))
        adam = types.AdamParams(learning_rate=0.02)
        for _ in range(2):
            tc.forward_backward([d], "cross_entropy").result()
            tc.optim_step(adam).result()
        path = tc.save_state("two").result().path
        tc.forward_backward([d], "cross_entropy").result()
        tc.optim_step(adam).result()
        uninterrupted = learner_logprobs(tc, tokens)

        rows = [j for j in dashboard(service, mine).json()["data"] if j["dialect"] == "tinker"]
        assert [(j["name"], j["status"], j["step"]) for j in rows] == [(tc.model_id, "running", 3)]
        page = dashboard(service, mine, f"/{rows[0]['id']}").json()
        assert [c["step"] for c in page["checkpoints"]] == [2]
        assert any(
            line["name"] == "loss:sum" and len(line["steps"]) == 3 for c in page["charts"] for line in c["lines"]
        )
        assert dashboard(service, other).json()["data"] == []  # the other tenant sees none of it
        assert dashboard(service, other, f"/{rows[0]['id']}").status_code == 404
        listed = httpx.get(f"{service.base_url}/v1/fine_tuning/jobs", headers={"Authorization": f"Bearer {mine}"})
        assert listed.json()["data"] == []  # the OpenAI routes list fine-tuning jobs only

        service.stop_all()
        service.wait_healthy(service.serve(workers=0, wait=False), timeout=400)
        rows = [j for j in dashboard(service, mine).json()["data"] if j["dialect"] == "tinker"]
        assert rows[0]["status"] == "paused"
        events = dashboard(service, mine, f"/{rows[0]['id']}").json()["events"]
        assert path in events[-1]["message"]
        client = tinker.ServiceClient(base_url=service.base_url, api_key="tml-" + mine)
        resumed = client.create_training_client_from_state_with_optimizer(path).result()
        resumed.forward_backward([d], "cross_entropy").result()
        resumed.optim_step(adam).result()
        np.testing.assert_array_equal(learner_logprobs(resumed, tokens), uninterrupted)
        rows = [j for j in dashboard(service, mine).json()["data"] if j["dialect"] == "tinker"]
        assert [(j["status"], j["step"]) for j in rows] == [("running", 3), ("paused", 3)]  # steps go on from the state
    finally:
        service.stop_all()
