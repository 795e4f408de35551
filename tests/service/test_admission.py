"""Admission's arithmetic without a cluster: which jobs could never fit, and the reasons a queued job shows.
(tests/service/test_cluster.py runs the same on a real 3-node Ray cluster through the server.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from openrft.service.admission import ClusterAdmission, refuse_if_never_fits
from openrft.service.errors import ApiError
from openrft.spec.dialects import load_job

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "arithmetic" / "recipe.yaml"


class FakeNodes(ClusterAdmission):
    def __init__(self, nodes: list[dict[str, float]]):
        super().__init__("head:6379")
        self._nodes = nodes

    def nodes(self) -> list[dict[str, float]]:
        return self._nodes


def _spec(replicas=1, threads=1, device="cpu", strategy="sync", generation_replicas=1):
    spec = load_job(RECIPE)
    spec.rollout.replicas, spec.rollout.strategy = replicas, strategy
    spec.rollout.generation_replicas = generation_replicas
    spec.runtime.threads, spec.runtime.device = threads, device
    return spec


def test_a_job_fits_when_each_of_its_bundles_finds_a_node():
    three = FakeNodes([{"CPU": 1.0}] * 3)
    assert three.never_fits(_spec(replicas=3)) is None
    assert three.never_fits(_spec(replicas=2, strategy="off_policy_async", generation_replicas=1)) is None
    why = three.never_fits(_spec(replicas=4))
    assert why == (
        "the job asks for 4 bundles of 1 CPU (rollout.replicas 4 learner(s) + 0 generation actor(s), "
        "runtime.threads 1 CPU each) but the Ray cluster can place at most 3: its nodes have 1, 1, 1 CPU "
        "(3 CPU in all)"
    )
    # 4 CPUs in all, but a bundle of 2 CPUs finds no node: never placed either
    assert "at most 0" in FakeNodes([{"CPU": 1.0}] * 4).never_fits(_spec(threads=2))
    assert FakeNodes([{"CPU": 4.0}]).never_fits(_spec(replicas=2, threads=2)) is None


def test_gpus_asked_for_count_like_cpus():
    no_gpu = FakeNodes([{"CPU": 8.0}] * 2)
    assert "bundles of 1 GPU" in no_gpu.never_fits(_spec(replicas=2, device="cuda"))
    assert no_gpu.never_fits(_spec(replicas=2, device="auto")) is None  # auto: no GPU asked where there is none
    gpus = FakeNodes([{"CPU": 8.0, "GPU": 1.0}] * 2)
    assert gpus.never_fits(_spec(replicas=2, device="cuda")) is None
    assert "at most 2" in gpus.never_fits(_spec(replicas=3, device="cuda"))


def test_the_waiting_reason_names_what_is_missing():
    assert ClusterAdmission.waiting({"CPU": 2.0}, {"CPU": 1.0, "memory": 9e9}, ["CPU"]) == (
        "waiting for resources on the Ray cluster: 2 CPU, 1 free"
    )
    both = ClusterAdmission.waiting({"CPU": 2.0, "GPU": 2.0}, {"CPU": 0.0}, ["CPU", "GPU"])
    assert both.endswith("2 CPU, 0 free; 2 GPU, 0 free")


def test_no_cluster_no_check_and_a_colocated_vllm_job_is_not_placed():
    refuse_if_never_fits(None, _spec(replicas=64))  # without --ray-address: nothing to check against
    spec = _spec()
    spec.rollout.engine = "vllm"  # stays in its job process: no placement group
    refuse_if_never_fits("head:6379", spec)


def test_refusal_is_a_400_naming_the_field(monkeypatch):
    import openrft.service.admission as admission

    monkeypatch.setitem(admission._admissions, "head:6379", FakeNodes([{"CPU": 1.0}]))
    with pytest.raises(ApiError) as refused:
        refuse_if_never_fits("head:6379", _spec(replicas=2), "run.replicas")
    assert (refused.value.status, refused.value.code, refused.value.param) == (400, "job_too_large", "run.replicas")
    assert refused.value.message.startswith("run.replicas: the job asks for 2 bundles of 1 CPU")


# the worker's side, with admission answered by a stand-in for the cluster ------------------------------------


class Running:
    pid = 1

    def poll(self):
        return None


class Launcher:
    def __init__(self):
        self.started: list[tuple[str, str | None]] = []

    def start(self, job_id, attempt, log, placement_group=None):
        self.started.append((job_id, placement_group))
        return Running()


class Answers:
    """``reserve`` answers from a list: a Decision, or an exception to raise."""

    def __init__(self, *answers):
        self.answers, self.released = list(answers), []

    def reserve(self, job_id, attempt, spec):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def release(self, job_id):
        self.released.append(job_id)


def _queued(store, spec: dict, owner: str = "alice"):
    from openrft.service.store.base import new_id
    from openrft.service.store.models import Job

    job = Job(id=new_id("ftjob-"), owner=owner, api="openai", status="queued", request={}, spec=spec, model="m")
    job.total_steps = 2
    return store.create_job(job)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_worker_starts_the_head_of_the_queue_only_with_its_placement_group(store, tmp_path):
    from openrft.service.admission import Decision
    from openrft.service.config import ServiceConfig
    from openrft.service.worker import Worker

    config = ServiceConfig.build(tmp_path, store.engine.url.render_as_string(hide_password=False))
    config.ray_address = "head:6379"
    launcher = Launcher()
    worker = Worker(store, config, concurrency=2, launcher=launcher)
    spec = _spec(replicas=2).model_dump(mode="json")
    first, second = _queued(store, spec), _queued(store, spec)
    waiting = "waiting for resources on the Ray cluster: 2 CPU, 1 free"
    worker.admission = Answers(Decision(reason=waiting), Decision(reason=waiting))
    worker.tick()
    worker.tick()  # the same reason again: recorded once
    assert launcher.started == []  # the head of the queue waits, and the job behind it waits its turn
    assert (store.get_job(None, first.id).status, store.get_job(None, first.id).queue_reason) == ("queued", waiting)
    assert store.get_job(None, second.id).queue_reason is None
    events = [e.message for e in store.list_events(first.id, limit=50)[0]]
    assert events.count(f"Queued: {waiting}") == 1

    worker.admission = Answers(ConnectionError("nothing answers at head:6379"))
    worker.tick()
    assert store.get_job(None, first.id).queue_reason == "cannot reach the Ray cluster: nothing answers at head:6379"

    worker.admission = Answers(Decision(group="openrft-a"), Decision(reason=waiting))
    worker.tick()  # reserved: claimed and started with its group; the next one waits, saying why
    assert launcher.started == [(first.id, "openrft-a")]
    assert (store.get_job(None, first.id).status, store.get_job(None, first.id).queue_reason) == ("running", None)
    assert store.get_job(None, second.id).queue_reason == waiting

    unreadable = _queued(store, {"not": "a job spec"})  # its job process fails it by name; the queue goes on
    worker.running.clear()
    worker.admission = Answers(Decision(group="openrft-b"))
    worker.tick()
    worker.tick()
    assert launcher.started[1:] == [(second.id, "openrft-b"), (unreadable.id, None)]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_cancel_frees_the_jobs_placement_group_at_once_and_the_job_ends_cancelled(store, tmp_path):
    """The worker removes a cancelled job's group at the first sight of the cancel (its actors stop with it), and
    the job process, whose actor calls then fail, records the job cancelled, not failed."""
    from openrft.service.admission import Decision
    from openrft.service.config import ServiceConfig
    from openrft.service.job_process import JobRunner
    from openrft.service.worker import Worker

    config = ServiceConfig.build(tmp_path, store.engine.url.render_as_string(hide_password=False))
    config.ray_address = "head:6379"
    config.ensure_dirs()
    launcher = Launcher()
    worker = Worker(store, config, launcher=launcher)
    job = _queued(store, _spec().model_dump(mode="json"), owner="local")  # the operator's: the environment is kept
    worker.admission = Answers(Decision(group="openrft-c"))
    worker.tick()
    assert launcher.started == [(job.id, "openrft-c")]
    store.request_cancel("local", job.id)
    worker.tick()
    assert worker.admission.released == [job.id]

    runner = JobRunner(store, config, job.id, 1, placement_group="openrft-c")

    def actors_gone():
        raise RuntimeError("The actor died unexpectedly before finishing this task")  # as RayActorError reads

    runner.build = actors_gone
    assert runner.run() == 0
    finished = store.get_job(None, job.id)
    assert finished.status == "cancelled" and finished.error_code is None


def test_dominant_shares_are_the_largest_fraction_of_any_resource_a_tenant_holds():
    from openrft.service.admission import dominant_shares

    two_cpus = _spec(replicas=2).model_dump(mode="json")
    one_cpu = _spec().model_dump(mode="json")
    gpus = _spec(replicas=2, device="cuda").model_dump(mode="json")
    shares = dominant_shares([("a", two_cpus), ("b", one_cpu), ("a", one_cpu)], {"CPU": 4.0})
    assert shares == {"a": 0.75, "b": 0.25}
    assert dominant_shares([("g", gpus)], {"CPU": 16.0, "GPU": 4.0}) == {"g": 0.5}  # 2 of 4 GPUs, 2 of 16 CPUs
    assert dominant_shares([("x", {"not": "a spec"})], {"CPU": 4.0}) == {}


class Shares(Answers):
    def totals(self):
        return {"CPU": 4.0}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_tenant_holding_the_least_of_the_cluster_goes_first(store, tmp_path):
    """Round-robin alone would take alice's job (her last claim is older than bob's); alice holds half the
    cluster and bob nothing, so bob's goes first. Equal holdings keep the round-robin order."""
    from openrft.service.admission import Decision
    from openrft.service.config import ServiceConfig
    from openrft.service.worker import Worker

    config = ServiceConfig.build(tmp_path, store.engine.url.render_as_string(hide_password=False))
    config.ray_address = "head:6379"
    launcher = Launcher()
    worker = Worker(store, config, concurrency=1, launcher=launcher)
    two_cpus = _spec(replicas=2).model_dump(mode="json")
    alice_running = _queued(store, two_cpus, owner="alice")
    worker.admission = Shares(Decision(group="g-alice"))
    worker.tick()  # alice holds 2 of the cluster's 4 CPUs from now on
    bob_done = _queued(store, two_cpus, owner="bob")
    worker.running.clear()
    worker.admission = Shares(Decision(group="g-bob"))
    worker.tick()  # bob's first job, claimed after alice's, then finished: bob holds nothing
    store.finish(bob_done.id, 1, "succeeded", "done")
    assert [started for started, _ in launcher.started] == [alice_running.id, bob_done.id]

    alice_next, bob_next = _queued(store, two_cpus, owner="alice"), _queued(store, two_cpus, owner="bob")
    assert [j.id for j in store.queued_heads()] == [alice_next.id, bob_next.id]  # the round-robin order
    worker.running.clear()
    worker.admission = Shares(Decision(group="g-bob-2"))
    worker.tick()
    assert launcher.started[-1] == (bob_next.id, "g-bob-2")  # by share: bob holds none, alice half
    assert store.get_job(None, alice_next.id).status == "queued"

    carol = _queued(store, two_cpus, owner="carol")
    worker.running.clear()
    worker.admission = Shares(Decision(group="g-carol"))
    worker.tick()  # alice and bob hold 2 CPUs each, carol none: carol's job, though queued last
    assert launcher.started[-1] == (carol.id, "g-carol")
