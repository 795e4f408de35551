"""Vertex-style tuning-job routes over the same store: create, list, get, :cancel, reward validation."""

from __future__ import annotations

import httpx
import pytest

from tests.service.svc_helpers import ROOT, all_events, small_dataset, upload, wait_status

pytestmark = pytest.mark.slow
BASE = "/v1/projects/demo/locations/us-central1"
REWARD = {
    "rewardName": "correct",
    "parseResponseConfig": {"parseType": "IDENTITY"},
    "stringMatchRewardScorer": {
        "correctAnswerReward": 1,
        "wrongAnswerReward": 0,
        "stringMatchExpression": {"matchOperation": "EXACT_MATCH", "expression": "{{references.ground_truth_answer}}"},
    },
}


def vertex_request(train: str, validation: str, steps: int) -> dict:
    return {
        "tunedModelDisplayName": "vertex-tiny",
        "baseModel": "openrft-demo",
        "labels": {"team": "ci"},
        "reinforcementTuningSpec": {
            "trainingDatasetUri": train,
            "validationDatasetUri": validation,
            "hyperParameters": {
                "stepCount": steps,
                "batchSize": 4,
                "samplesPerPrompt": 4,
                "evaluateInterval": 1,
                "checkpointInterval": 1,
                "maxOutputTokens": 6,
            },
            "singleRewardConfig": REWARD,
        },
        "openrft": {"eval_max_examples": 4, "max_train_examples": 16, "tensorboard": False, "threads": 1},
    }


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_vertex_tuning_job_lifecycle(service, tmp_path):
    service.serve(workers=1)
    with httpx.Client(base_url=service.base_url, timeout=30) as client:
        train = upload(client, small_dataset(tmp_path / "t.jsonl", ROOT / "examples/arithmetic/vertex_train.jsonl", 16))
        validation = upload(
            client, small_dataset(tmp_path / "v.jsonl", ROOT / "examples/arithmetic/vertex_validation.jsonl", 4)
        )
        created = client.post(f"{BASE}/tuningJobs", json=vertex_request(train, validation, 2))
        assert created.status_code == 200, created.text
        job = created.json()
        assert job["state"] == "JOB_STATE_QUEUED" and job["baseModel"] == "openrft-demo"
        assert job["name"].startswith("projects/demo/locations/us-central1/tuningJobs/ftjob-")
        job_id = job["name"].rsplit("/", 1)[-1]
        assert job["reinforcementTuningSpec"]["trainingDatasetUri"] == train and job["labels"] == {"team": "ci"}

        # a second job waits behind the first (one worker): the Vertex cancel call answers {} and stops it
        second = client.post(f"{BASE}/tuningJobs", json=vertex_request(train, validation, 200)).json()
        second_id = second["name"].rsplit("/", 1)[-1]
        assert client.post(f"{BASE}/tuningJobs/{second_id}:cancel").json() == {}
        assert client.get(f"{BASE}/tuningJobs/{second_id}").json()["state"] == "JOB_STATE_CANCELLED"

        assert wait_status(client, job_id, ("succeeded", "failed"))["status"] == "succeeded"
        done = client.get(f"{BASE}/tuningJobs/{job_id}").json()
        assert done["state"] == "JOB_STATE_SUCCEEDED" and done["endTime"] and done["tunedModel"]["model"]
        assert 1 <= len(done["tunedModel"]["checkpoints"]) <= 3
        assert [e["data"]["step"] for e in all_events(client, job_id) if e["type"] == "metrics"] == [0, 1, 2]

        listed = client.get(f"{BASE}/tuningJobs", params={"pageSize": 1}).json()
        assert [j["name"].rsplit("/", 1)[-1] for j in listed["tuningJobs"]] == [second_id]
        rest = client.get(f"{BASE}/tuningJobs", params={"pageSize": 1, "pageToken": listed["nextPageToken"]}).json()
        assert [j["name"].rsplit("/", 1)[-1] for j in rest["tuningJobs"]] == [job_id] and not rest.get("nextPageToken")
        # one store: the Vertex job is an OpenAI job too
        assert client.get(f"/v1/fine_tuning/jobs/{job_id}").json()["status"] == "succeeded"

        request = vertex_request(train, validation, 2)
        request["reinforcementTuningSpec"]["hyperParameters"]["learningRateMultiplier"] = 9
        bad = client.post(f"{BASE}/tuningJobs", json=request)
        assert bad.status_code == 400
        error = bad.json()["error"]
        assert error["status"] == "INVALID_ARGUMENT"
        fields = [v["field"] for v in error["details"][0]["fieldViolations"]]
        assert "reinforcementTuningSpec.hyperParameters.learningRateMultiplier" in fields


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_validate_reinforcement_tuning_reward(service):
    service.serve(workers=0)
    example = {
        "contents": [{"role": "user", "parts": [{"text": "What is 2+2?"}]}],
        "references": {"ground_truth_answer": "4"},
    }
    with httpx.Client(base_url=service.base_url, timeout=30) as client:
        for answer, reward in (("4", 1.0), ("5", 0.0)):
            response = client.post(
                f"{BASE}/tuningJobs:validateReinforcementTuningReward",
                json={
                    "singleRewardConfig": REWARD,
                    "example": example,
                    "sampleResponse": {"role": "model", "parts": [{"text": answer}]},
                },
            )
            assert response.status_code == 200, response.text
            assert response.json()["overallReward"] == reward
            assert response.json()["rewardInfoDetails"]["correct"]["reward"] == reward
        always = {
            **REWARD,
            "rewardName": "always",
            "stringMatchRewardScorer": {
                **REWARD["stringMatchRewardScorer"],
                "stringMatchExpression": {"matchOperation": "REGEX_CONTAINS", "expression": ".*"},
            },
        }
        composite = {
            "weightedRewardConfigs": [{"rewardConfig": REWARD, "weight": 3}, {"rewardConfig": always, "weight": 1}]
        }
        response = client.post(
            f"{BASE}/tuningJobs:validateReinforcementTuningReward",
            json={
                "compositeRewardConfig": composite,
                "example": example,
                "sampleResponse": {"role": "model", "parts": [{"text": "5"}]},
            },
        )
        assert response.status_code == 200, response.text
        assert response.json()["overallReward"] == pytest.approx(0.25)  # (3*0 + 1*1) / 4
        bad = client.post(
            f"{BASE}/tuningJobs:validateReinforcementTuningReward",
            json={
                "singleRewardConfig": {**REWARD, "parseResponseConfig": {"parseType": "NOPE"}},
                "example": example,
                "sampleResponse": {"parts": [{"text": "4"}]},
            },
        )
        assert bad.status_code == 400 and "parseResponseConfig.parseType" in bad.text
