"""The service on a Ray cluster (docs/scaling.md, "The service on a Ray cluster"): ``openrft serve --ray-address``
runs every job's learners as actors on that cluster, and each job shows what it asks for before it starts.

A real cluster of three nodes on this machine (``ray.cluster_utils.Cluster``: a head and two workers, one CPU
each, a custom resource naming each), a real server process pointed at it, jobs submitted with the official
``openai`` client and as a Vertex body. Where their actors ran is read from Ray's own state (the GCS actor and
node tables), not from our logs: with the service building the local runtime again, the OpenAI job fails (its
spec says ``runtime: ray``) and the Vertex job creates no actor, and the test fails either way."""

from __future__ import annotations

import time
from collections import defaultdict

import httpx
import openai
import pytest

from tests.service.svc_helpers import ROOT, TRAIN, VALIDATION, small_dataset, upload
from tests.service.test_vertex import BASE, vertex_request

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
GRADER = {
    "type": "string_check",
    "name": "correct",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_answer}}",
    "operation": "eq",
}
SMALL = {"max_new_tokens": 6, "eval_max_examples": 4, "tensorboard": False, "threads": 1, "device": "cpu"}


@pytest.fixture
def cluster():
    """Three Ray nodes of one CPU each on this machine, torn down after the test."""
    from ray.cluster_utils import Cluster

    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"node_head": 1}, "include_dashboard": False},
    )
    try:
        for name in ("node_a", "node_b"):
            nodes.add_node(num_cpus=1, resources={name: 1})
        nodes.wait_for_nodes()
        yield nodes
    finally:
        nodes.shutdown()


def _learner_actors(cluster) -> dict[str, list[dict]]:
    """The LearnerActor actors Ray's GCS recorded (alive or dead), by the Ray job that created them."""
    by_job = defaultdict(list)
    for actor in cluster.global_state.actor_table(None).values():
        if actor["ActorClassName"] == "LearnerActor":
            by_job[actor["JobID"]].append(actor)
    return dict(by_job)


def _wait(get, timeout: float = 420):
    deadline = time.monotonic() + timeout
    while (job := get())["status"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(1)
    return job


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_jobs_of_every_route_run_as_actors_on_the_servers_cluster(cluster, service, tmp_path):
    service.serve(workers=2, extra=("--ray-address", cluster.address))
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="sk-local", max_retries=0)
    with small_dataset(tmp_path / "train.jsonl", TRAIN, 8).open("rb") as f:
        train = client.files.create(file=f, purpose="fine-tune")
    with small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4).open("rb") as f:
        validation = client.files.create(file=f, purpose="fine-tune")
    on_ray = client.fine_tuning.jobs.create(
        model="openrft-demo",
        training_file=train.id,
        validation_file=validation.id,
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": GRADER,
                "hyperparameters": {"n_epochs": 1, "batch_size": 4, "eval_interval": 2, "eval_samples": 1},
            },
        },
        extra_body={"openrft": {**SMALL, "runtime": "ray", "replicas": 2}},
    )
    # what it will ask for, on the job object before it starts
    assert on_ray.status == "queued"
    assert on_ray.to_dict()["resources"] == {
        "runtime": "ray",
        "learners": 2,
        "generation_replicas": 0,
        "cpu": 2.0,
        "gpu": 0.0,
        "ray_address_set": True,
        "bundles": [{"CPU": 1.0}, {"CPU": 1.0}],
    }

    with httpx.Client(base_url=service.base_url, timeout=30) as http:  # a Vertex body naming no runtime
        vertex_train = upload(
            http, small_dataset(tmp_path / "vt.jsonl", ROOT / "examples/arithmetic/vertex_train.jsonl", 8)
        )
        body = vertex_request(vertex_train, vertex_train, 1)
        body["openrft"] = {"eval_max_examples": 4, "tensorboard": False, "threads": 1, "device": "cpu"}
        created = http.post(f"{BASE}/tuningJobs", json=body)
        assert created.status_code == 200, created.text
        assert created.json()["state"] == "JOB_STATE_QUEUED"
        assert created.json()["resources"]["runtime"] == "ray" and created.json()["resources"]["cpu"] == 1.0
        vertex_id = created.json()["name"].rsplit("/", 1)[-1]
        dashboard = http.get(f"/v1/dashboard/jobs/{vertex_id}").json()["job"]["resources"]
        assert dashboard == created.json()["resources"]

        ray_job = _wait(lambda: client.fine_tuning.jobs.retrieve(on_ray.id).to_dict())
        vertex_job = _wait(lambda: http.get(f"/v1/fine_tuning/jobs/{vertex_id}").json())
    assert ray_job["status"] == "succeeded", ray_job.get("error")
    assert vertex_job["status"] == "succeeded", vertex_job.get("error")
    steps = [e.data["step"] for e in client.fine_tuning.jobs.list_events(on_ray.id, limit=100) if e.type == "metrics"]
    assert sorted(steps) == [0, 1, 2]  # 8 prompts / 4 a step, one epoch: every step ran

    # Ray's own record: two Ray jobs (the two job processes) made learner actors on this cluster's nodes
    nodes = {n["NodeID"]: n["Resources"] for n in cluster.global_state.node_table()}
    actors = _learner_actors(cluster)
    assert sorted(len(a) for a in actors.values()) == [1, 2], actors
    for group in actors.values():
        assert all(a["Address"]["NodeID"] in nodes for a in group)
    pair = next(group for group in actors.values() if len(group) == 2)
    assert len({a["Address"]["NodeID"] for a in pair}) == 2  # one CPU a node: the two learners on two nodes
