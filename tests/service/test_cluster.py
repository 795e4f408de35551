"""The service on a Ray cluster (docs/scaling.md, "The service on a Ray cluster"): ``openrft serve --ray-address``
runs every job's learners as actors on that cluster once their placement group is reserved (until then the job
stays queued saying what it waits for), refuses a job larger than the cluster, and each job shows what it asks for
before it starts.

A real cluster of three nodes on this machine (``ray.cluster_utils.Cluster``: a head and two workers, one CPU
each, a custom resource naming each), a real server process pointed at it, jobs submitted with the official
``openai`` client, as a Nova recipe and as a Vertex body. Where their actors ran is read from Ray's own state (the
GCS actor and node tables), not from our logs: with the service building the local runtime again, the OpenAI and
Nova jobs fail (their specs say ``runtime: ray``) and the Vertex job creates no actor: the test fails."""

from __future__ import annotations

import re
import time
from collections import defaultdict

import httpx
import openai
import pytest

from tests.service.svc_helpers import ROOT, TRAIN, VALIDATION, free_port, small_dataset, tiny_recipe, upload
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


def three_nodes(ray_client_port: int | None = None, **system_config):
    """Three Ray nodes of one CPU each on this machine (``system_config``: the GCS's settings), torn down after;
    ``ray_client_port``: the head also serves Ray Client there (``ray://127.0.0.1:PORT``)."""
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 1, "resources": {"node_head": 1}, "include_dashboard": False}
    if ray_client_port:
        head["ray_client_server_port"] = ray_client_port
    nodes = Cluster(initialize_head=True, head_node_args={**head, "_system_config": system_config})
    try:
        for name in ("node_a", "node_b"):
            nodes.add_node(num_cpus=1, resources={name: 1})
        nodes.wait_for_nodes()
        yield nodes
    finally:
        nodes.shutdown()


@pytest.fixture
def cluster():
    yield from three_nodes()


@pytest.fixture
def client_cluster():
    """As ``cluster``, its head also serving Ray Client; the address to give: ``client_cluster.client_address``."""
    port = free_port()
    for nodes in three_nodes(ray_client_port=port):
        nodes.client_address = f"ray://127.0.0.1:{port}"
        yield nodes


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
def test_jobs_of_every_route_run_as_actors_on_the_servers_cluster_once_their_resources_are_free(
    client_cluster, service, tmp_path
):
    """Through Ray Client (``--ray-address ray://HOST:PORT``): the server's admission and each job process are Ray
    Client sessions of the head."""
    cluster = client_cluster
    service.serve(workers=3, extra=("--ray-address", cluster.client_address))
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="sk-local", max_retries=0)
    with small_dataset(tmp_path / "train.jsonl", TRAIN, 8).open("rb") as f:
        train = client.files.create(file=f, purpose="fine-tune")
    with small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4).open("rb") as f:
        validation = client.files.create(file=f, purpose="fine-tune")

    def create(**openrft):
        return demo_job(client, train.id, validation.id, **openrft)

    # larger than the whole cluster (4 learners of 1 CPU, 3 nodes of 1 CPU): refused at submission, by name
    with pytest.raises(openai.BadRequestError) as refused:
        create(runtime="ray", replicas=4)
    assert refused.value.body["code"] == "job_too_large" and refused.value.body["param"] == "openrft.replicas"
    assert "4 bundles of 1 CPU" in refused.value.body["message"] and "at most 3" in refused.value.body["message"]

    on_ray = create(runtime="ray", replicas=2)
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

    with httpx.Client(base_url=service.base_url, timeout=30) as http:
        recipe = tiny_recipe(train.id, validation.id, steps=1)  # a Nova recipe with runtime: ray, one learner
        recipe["openrft"].update(runtime="ray", device="cpu")
        nova = http.post("/v1/nova/jobs", json=recipe)
        assert nova.status_code == 200, nova.text
        assert nova.json()["resources"]["cpu"] == 1.0 and nova.json()["resources"]["bundles"] == [{"CPU": 1.0}]
        nova_id = nova.json()["id"]

        # a Vertex body naming no runtime, 2 learners
        vertex_file = small_dataset(tmp_path / "vt.jsonl", ROOT / "examples/arithmetic/vertex_train.jsonl", 8)
        vertex_train = upload(http, vertex_file)
        body = vertex_request(vertex_train, vertex_train, 1)
        body["openrft"] = {"eval_max_examples": 4, "tensorboard": False, "threads": 1, "device": "cpu", "replicas": 2}
        created = http.post(f"{BASE}/tuningJobs", json=body)
        assert created.status_code == 200, created.text
        assert created.json()["state"] == "JOB_STATE_QUEUED"
        asked = created.json()["resources"]
        assert asked["runtime"] == "ray" and asked["cpu"] == 2.0 and asked["ray_address_set"]
        vertex_id = created.json()["name"].rsplit("/", 1)[-1]
        assert http.get(f"/v1/dashboard/jobs/{vertex_id}").json()["job"]["resources"] == asked

        # 3 CPUs: while the first job holds 2 (and the Nova job 1), the Vertex job (2 CPUs) stays queued, saying
        # what it waits for
        deadline = time.monotonic() + 240
        while (waiting := http.get(f"/v1/fine_tuning/jobs/{vertex_id}").json())["queue_reason"] is None:
            assert waiting["status"] == "queued" and time.monotonic() < deadline, waiting
            time.sleep(0.5)
        assert waiting["status"] == "queued"
        assert re.fullmatch(r"waiting for resources on the Ray cluster: 2 CPU, [01] free", waiting["queue_reason"])
        assert client.fine_tuning.jobs.retrieve(on_ray.id).status == "running"
        as_vertex = http.get(f"{BASE}/tuningJobs/{vertex_id}").json()
        assert (as_vertex["state"], as_vertex["queueReason"]) == ("JOB_STATE_PENDING", waiting["queue_reason"])
        assert http.get(f"/v1/dashboard/jobs/{vertex_id}").json()["job"]["queue_reason"] == waiting["queue_reason"]

        ray_job = _wait(lambda: client.fine_tuning.jobs.retrieve(on_ray.id).to_dict())
        nova_job = _wait(lambda: http.get(f"/v1/fine_tuning/jobs/{nova_id}").json())
        vertex_job = _wait(lambda: http.get(f"/v1/fine_tuning/jobs/{vertex_id}").json())
    assert ray_job["status"] == "succeeded", ray_job.get("error")
    assert nova_job["status"] == "succeeded", nova_job.get("error")
    assert vertex_job["status"] == "succeeded", vertex_job.get("error")
    assert vertex_job["queue_reason"] is None
    steps = [e.data["step"] for e in client.fine_tuning.jobs.list_events(on_ray.id, limit=100) if e.type == "metrics"]
    assert sorted(steps) == [0, 1, 2]  # 8 prompts / 4 a step, one epoch: every step ran
    messages = [e.message for e in client.fine_tuning.jobs.list_events(vertex_id, limit=100)]
    assert any(re.fullmatch(r"Queued: waiting for resources on the Ray cluster: 2 CPU, [01] free", m) for m in messages)

    # Ray's own record: each job's process made its learner actors on this cluster's nodes, two learners on two
    nodes = {n["NodeID"] for n in cluster.global_state.node_table()}
    actors = _learner_actors(cluster)
    assert sorted(len(a) for a in actors.values()) == [1, 2, 2], actors
    for group in actors.values():
        assert {a["Address"]["NodeID"] for a in group} <= nodes
        assert len({a["Address"]["NodeID"] for a in group}) == len(group)  # one CPU a node: one learner a node


def demo_job(client: openai.OpenAI, train: str, validation: str, eval_interval: int = 2, **openrft):
    """The small demo job through the official client: 4 prompts a step, the exact-answer grader, one epoch;
    ``openrft``: the job's OpenRFT settings over ``SMALL``."""
    return client.fine_tuning.jobs.create(
        model="openrft-demo",
        training_file=train,
        validation_file=validation,
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": GRADER,
                "hyperparameters": {"n_epochs": 1, "batch_size": 4, "eval_interval": eval_interval, "eval_samples": 1},
            },
        },
        extra_body={"openrft": {**SMALL, **openrft}},
    )


def _checkpointing_ray_job(client: openai.OpenAI, tmp_path, prompts: int):
    """A ``runtime: ray`` demo job of 2 learners on ``prompts`` prompts (4 a step), a checkpoint every step."""
    with small_dataset(tmp_path / "train.jsonl", TRAIN, prompts).open("rb") as f:
        train = client.files.create(file=f, purpose="fine-tune")
    with small_dataset(tmp_path / "validation.jsonl", VALIDATION, 2).open("rb") as f:
        validation = client.files.create(file=f, purpose="fine-tune")
    # a checkpoint at every evaluation: every step
    return demo_job(client, train.id, validation.id, eval_interval=1, runtime="ray", replicas=2, eval_max_examples=2)


def _wait_past_step(client: openai.OpenAI, job_id: str, step: int) -> None:
    deadline = time.monotonic() + 240
    while not any(
        e.type == "metrics" and e.data["step"] >= step for e in client.fine_tuning.jobs.list_events(job_id, limit=200)
    ):
        assert client.fine_tuning.jobs.retrieve(job_id).status in ("queued", "running") and time.monotonic() < deadline
        time.sleep(0.5)


@pytest.fixture
def fast_cluster():
    """As ``cluster``, with the GCS noticing a dead node within about two seconds (it checks every 500 ms and gives
    up after 4 failed checks; Ray's defaults take about 15 s)."""
    yield from three_nodes(health_check_period_ms=500, health_check_failure_threshold=4)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_node_lost_mid_job_its_learners_come_back_on_the_other_nodes_and_the_job_resumes_from_its_checkpoint(
    fast_cluster, service, tmp_path
):
    """A ``runtime: ray`` job with 2 learners (one a node) and a checkpoint every step; once it has passed step 2
    the node of one of its learners is removed (its raylet and workers killed). The job process hands the job
    back, its worker frees the attempt's placement group and admits it again on the 2 remaining nodes, and it
    resumes from its last checkpoint: it succeeds with every step's metrics once, its events saying what
    happened. Without the hand-back the job fails (``ray_actors_lost``) and this test with it."""
    cluster = fast_cluster
    service.serve(workers=1, extra=("--ray-address", cluster.address))
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="sk-local", max_retries=0)
    job = _checkpointing_ray_job(client, tmp_path, prompts=40)  # 10 steps: 8 after the loss

    def events() -> list:
        return list(client.fine_tuning.jobs.list_events(job.id, limit=200))

    _wait_past_step(client, job.id, 2)

    # the node of one of its learners, from Ray's own actor table (the head's is kept: the drivers are there)
    head = cluster.head_node.node_id
    alive = [a for a in _learner_actors(cluster).popitem()[1] if a["State"] == "ALIVE"]
    assert len(alive) == 2, alive
    lost_node = next(a["Address"]["NodeID"] for a in alive if a["Address"]["NodeID"] != head)
    cluster.remove_node(next(n for n in cluster.worker_nodes if n.node_id == lost_node), allow_graceful=False)

    done = _wait(lambda: client.fine_tuning.jobs.retrieve(job.id).to_dict(), timeout=300)
    messages = [e.message for e in reversed(events())]
    assert done["status"] == "succeeded", (done.get("error"), messages)
    steps = [e.data["step"] for e in events() if e.type == "metrics"]
    assert sorted(steps) == list(range(11)), steps  # 40 prompts / 4 a step, and the baseline: each step once
    lost = [m for m in messages if m.startswith("Its Ray actors were lost with")]
    assert len(lost) == 1 and "attempt 1 of 3" in lost[0], messages
    # the node, where the error names an actor (an object lost with it names none: "with their node or ...")
    assert lost_node[:12] in lost[0] or "with their node or worker process" in lost[0], (lost_node, lost[0])
    assert re.search(r"resumes from its last checkpoint \(step [2-9]\)", lost[0]), lost[0]
    later = messages[messages.index(lost[0]) :]
    assert any(m.startswith("Job handed back: its Ray actors were lost") for m in later), messages
    assert any(re.fullmatch(r"Resuming from the checkpoint at step [2-9]", m) for m in later), messages

    # Ray's record: the first attempt's group removed; the second attempt's learners on the two remaining nodes
    groups = {g["name"]: g["state"] for g in cluster.global_state.placement_group_table().values()}
    assert groups.get(f"openrft-{job.id}-a1") == "REMOVED", groups
    by_job = _learner_actors(cluster)
    assert len(by_job) == 2, by_job
    second = [actors for actors in by_job.values() if lost_node not in {a["Address"]["NodeID"] for a in actors}]
    remaining = {n["NodeID"] for n in cluster.global_state.node_table() if n["Alive"]}
    assert len(second) == 1 and {a["Address"]["NodeID"] for a in second[0]} == remaining, by_job


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_server_killed_mid_job_and_restarted_resumes_its_cluster_job_from_its_checkpoint(
    cluster, service, tmp_path
):
    """A ``runtime: ray`` job with 2 learners and a checkpoint every step; past step 2 the server (its embedded
    worker, the job's placement group's owner) is killed with SIGKILL, and its job process ends with it. A new server
    on the same data directory and cluster, whose heartbeat timeout (10 minutes) is far beyond this test, hands the
    job back at once because the old worker's process is gone, reserves a new placement group and resumes from the
    last checkpoint: the job succeeds with every step's metrics once, nothing of the first attempt left on the
    cluster. Without the hand-back the job stays ``running`` and the test times out."""
    first = service.serve(workers=1, extra=("--ray-address", cluster.address))
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="sk-local", max_retries=0)
    job = _checkpointing_ray_job(client, tmp_path, prompts=32)  # 8 steps
    _wait_past_step(client, job.id, 2)
    import psutil

    job_processes = psutil.Process(first.proc.pid).children()
    first.kill()
    _gone, alive = psutil.wait_procs(job_processes, timeout=15)
    assert not alive, "the job process outlived its server"

    service.serve(workers=1, heartbeat_timeout=600, extra=("--ray-address", cluster.address))
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="sk-local", max_retries=0)
    done = _wait(lambda: client.fine_tuning.jobs.retrieve(job.id).to_dict(), timeout=300)
    messages = [e.message for e in reversed(list(client.fine_tuning.jobs.list_events(job.id, limit=200)))]
    assert done["status"] == "succeeded", (done.get("error"), messages)
    ended = [m for m in messages if re.fullmatch(r"worker \S+ ended \(its process is gone\); requeued.*", m)]
    assert len(ended) == 1, messages
    assert any(re.fullmatch(r"Resuming from the checkpoint at step [2-8]", m) for m in messages), messages
    steps = [e.data["step"] for e in client.fine_tuning.jobs.list_events(job.id, limit=200) if e.type == "metrics"]
    assert sorted(steps) == list(range(9)), steps  # 32 prompts / 4 a step, and the baseline: each step once

    groups = {g["name"]: g["state"] for g in cluster.global_state.placement_group_table().values()}
    assert groups.get(f"openrft-{job.id}-a1") == "REMOVED" and groups.get(f"openrft-{job.id}-a2") == "REMOVED", groups
    attempts = _learner_actors(cluster)
    assert len(attempts) == 2 and all(a["State"] == "DEAD" for group in attempts.values() for a in group), attempts
