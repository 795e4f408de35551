"""Following a grader from ``graders/run`` to its score stays short (docs/design.md), and the request's own
checks, run with its body, answer as before: 400 naming the bound or the item's field."""

from __future__ import annotations

import shutil

import pytest
from fastapi.testclient import TestClient
from scripts import grader_walk

from openrft.service.app import create_app
from openrft.service.config import ServiceConfig
from openrft.service.store import Store


def test_a_string_check_grader_is_followed_through_at_most_ten_files():
    walk = grader_walk.walks({"string_check": grader_walk.STRING_CHECK})["string_check"]
    assert walk["reward"] == 1.0
    assert walk["visited"][:3] == ["service/routes_openai.py", "service/tenancy.py", "service/graders.py"]
    assert "rewards/kinds/openai_graders.py" in walk["visited"]
    assert walk["files"] <= grader_walk.LIMIT, walk["visited"]


@pytest.fixture(scope="module")
def every_walk() -> dict[str, dict]:
    graders = dict(grader_walk.GRADERS)
    if shutil.which("bwrap") is None:  # the python grader's strict sandbox; tests/rewards/test_sandbox.py needs it too
        graders.pop("python")
    return grader_walk.walks(graders)


@pytest.mark.parametrize("kind", list(grader_walk.GRADERS))
def test_every_grader_kind_is_followed_through_at_most_ten_files(every_walk, kind):
    if kind not in every_walk:
        pytest.skip("bubblewrap (bwrap) is not installed: the python grader cannot run")
    walk = every_walk[kind]
    assert walk["reward"] == 1.0
    assert walk["visited"][:3] == ["service/routes_openai.py", "service/tenancy.py", "service/graders.py"]
    assert walk["files"] <= grader_walk.LIMIT, walk["visited"]


def test_request_checks_answer_with_their_code(tmp_path):
    config = ServiceConfig.build(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}")
    store = Store.open(config.database_url)
    try:
        client = TestClient(create_app(config, store))
        deep: dict = {}
        for _ in range(100):
            deep = {"x": deep}
        grader = {**grader_walk.STRING_CHECK, "extra": deep}
        answer = client.post(grader_walk.ROUTE, json={"grader": grader, "model_sample": "42"})
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == "document_too_complex"
        assert "grader nests deeper than 64 levels" in answer.json()["error"]["message"]
        item = {"messages": [{"role": "robot", "content": "hi"}]}
        answer = client.post(
            grader_walk.ROUTE, json={"grader": grader_walk.STRING_CHECK, "model_sample": "", "item": item}
        )
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_item", "item.messages")
        assert "messages[0].role: 'robot' is not one of" in error["message"]
    finally:
        store.close()
