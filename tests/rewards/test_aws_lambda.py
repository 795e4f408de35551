"""An unmapped Lambda ARN with AWS credentials is invoked through boto3, tested against moto's server on
127.0.0.1. Moto runs Lambda code only in Docker, which this machine lacks: its Docker-free backend echoes the
event back, or answers results queued through its API. So this checks the client plumbing honestly: the
event boto3 delivers is exactly the one built for the samples, and the queued answer (the handler's own
result, computed here) is what the reward scores."""

from __future__ import annotations

import asyncio
import io
import json
import zipfile

import httpx
import pytest

from openrft.rewards import RewardSample, build_reward
from openrft.rewards.kinds.nova_lambda import nova_entry
from openrft.rewards.lambdas import AwsLambdaInvoker
from openrft.spec.dialects import resolve_document
from openrft.spec.rewards import RewardSpec
from tests.monitoring.servers import moto_server
from tests.rewards.helpers import example

ACCOUNT = "123456789012"
ARN = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:grader"
HANDLER = "def lambda_handler(event, context):\n    return []\n"


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    pytest.importorskip("boto3")
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as url:
        httpx.post(f"{url}/moto-api/config", json={"lambda": {"use_docker": False}}).raise_for_status()
        yield url


@pytest.fixture
def aws(moto, monkeypatch):
    import boto3

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": moto,
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    iam = boto3.client("iam")
    role = iam.create_role(RoleName="grader-role", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("reward.py", HANDLER)
    lam = boto3.client("lambda")
    lam.create_function(
        FunctionName="grader",
        Runtime="python3.12",
        Role=role,
        Handler="reward.lambda_handler",
        Code={"ZipFile": archive.getvalue()},
    )
    yield moto
    lam.delete_function(FunctionName="grader")
    iam.delete_role(RoleName="grader-role")


def samples() -> list[RewardSample]:
    ex = example(id="q-1", reference_answer="5")
    return [RewardSample(ex, text, step=1, sample_index=i) for i, text in enumerate(["5", "6"])]


def test_the_event_reaches_the_lambda_as_built(aws):
    event = [nova_entry(s) for s in samples()]
    echoed = asyncio.run(AwsLambdaInvoker(ARN, 30).invoke(event))  # moto's Docker-free backend echoes it
    assert echoed == event


def test_a_lambda_arn_with_credentials_resolves_and_scores_its_answer(aws):
    recipe = {
        "run": {"model_name_or_path": "openrft-demo", "data_s3_path": "train.jsonl", "reward_lambda_arn": ARN},
        "training_config": {"trainer": {"max_steps": 1}},
    }
    spec = resolve_document(recipe, dataset_size=lambda location: 100).spec
    assert spec.reward.function.endpoint == ARN and spec.reward.function.transport == "aws"
    answer = [
        {"id": "q-1", "aggregate_reward_score": 1.0, "metrics_list": [{"name": "m", "value": 2.0, "type": "Metric"}]},
        {"id": "q-1", "aggregate_reward_score": 0.25},
    ]
    queued = {"results": [json.dumps(answer)], "region": "us-east-1", "account_id": ACCOUNT}
    httpx.post(f"{aws}/moto-api/static/lambda-simple/response", json=queued).raise_for_status()
    reward = build_reward(RewardSpec.model_validate({"function": spec.reward.function.model_dump()}))

    async def go():
        try:
            return await reward.score(samples())
        finally:
            await reward.aclose()

    outcomes = asyncio.run(go())
    assert [o.score for o in outcomes] == [1.0, 0.25] and outcomes[0].metrics == {"m": 2.0}
