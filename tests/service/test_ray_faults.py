"""A job's Ray actors lost with their node are told apart from the job's own errors (``runtime.ray_faults``), the
service's job process then hands the job back to be resumed (its worker requeues it: ``RESUME_EXIT``), and Ray is
never imported for it. The whole path on a real cluster: ``test_cluster.py``, a node removed mid-job."""

from __future__ import annotations

import subprocess
import sys

import pytest

from openrft.errors import OpenRFTError
from openrft.runtime.ray_faults import lost_actors

exceptions = pytest.importorskip("ray.exceptions")
NODE = "81d17c45a22e3f0b9c6d7e8f00112233445566778899aabbccddeeff"


def _raised(outer: Exception, inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as exc:
            raise outer from exc
    except Exception as exc:
        return exc


def test_a_lost_actor_anywhere_in_the_chain_is_named_with_its_node():
    died = exceptions.NodeDiedError(f"The node with node id: {NODE} and address: 127.0.0.1 has been marked dead")
    assert lost_actors(died) == "its Ray actors were lost with node 81d17c45a22e (NodeDiedError)"
    wrapped = _raised(OpenRFTError("checkpoint failed"), _raised(RuntimeError("step"), died))
    assert lost_actors(wrapped) == "its Ray actors were lost with node 81d17c45a22e (NodeDiedError)"
    actor = exceptions.ActorDiedError()  # no cause: no node to name
    assert lost_actors(actor) == "its Ray actors were lost with their node or worker process (ActorDiedError)"
    assert lost_actors(_raised(ValueError("x"), exceptions.ActorUnavailableError("gone", None))) is not None


def test_the_jobs_own_errors_are_not_a_loss():
    assert lost_actors(OpenRFTError("reward endpoint down")) is None
    assert lost_actors(_raised(ValueError("bad"), KeyError("k"))) is None
    assert lost_actors(exceptions.RayTaskError("f", "Traceback", ValueError("the job's own bug"))) is None


def test_ray_is_not_imported_to_tell():
    code = (
        "import sys; from openrft.runtime.ray_faults import lost_actors; "
        "assert lost_actors(ValueError('x')) is None; assert 'ray' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class Ended:
    pid = 1

    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_job_process_hands_a_lost_job_back_and_its_worker_frees_the_group_before_requeueing(store, tmp_path):
    from openrft.service.admission import Decision
    from openrft.service.config import ServiceConfig
    from openrft.service.exit_codes import RESUME_EXIT
    from openrft.service.job_process import JobRunner
    from openrft.service.worker import Worker
    from tests.service.test_admission import Answers, Launcher, _queued, _spec

    config = ServiceConfig.build(tmp_path, store.engine.url.render_as_string(hide_password=False))
    config.ray_address = "head:6379"
    config.ensure_dirs()
    worker = Worker(store, config, launcher=Launcher())
    job = _queued(store, _spec().model_dump(mode="json"), owner="local")
    worker.admission = Answers(Decision(group="openrft-a1"))
    worker.tick()

    def lost():
        try:
            raise exceptions.ActorDiedError()
        except exceptions.RayActorError as exc:
            raise OpenRFTError("the learner's step failed") from exc

    runner = JobRunner(store, config, job.id, 1, placement_group="openrft-a1")
    runner.build = lost
    assert runner.run() == RESUME_EXIT
    assert store.get_job(None, job.id).status == "running"  # its worker requeues it, once its group is freed
    requeued_with = []
    worker.admission.release = lambda job_id: requeued_with.append(store.get_job(None, job_id).status)
    worker.running[job.id].process = Ended(RESUME_EXIT)
    worker.admission.answers = [Decision(reason="waiting for resources on the Ray cluster: 2 CPU, 1 free")]
    worker.tick()
    assert requeued_with == ["running"]  # the group went back before the job could be admitted again
    assert store.get_job(None, job.id).status == "queued"
    messages = [e.message for e in store.list_events(job.id, limit=50)[0]]
    assert any(
        m.startswith("Its Ray actors were lost with their node or worker process (ActorDiedError) on attempt 1 of 3")
        and m.endswith("resumes from the start (no checkpoint yet) on the Ray cluster's remaining nodes")
        for m in messages
    ), messages
    assert "Job handed back: its Ray actors were lost; its placement group freed; requeued" in messages

    # the last attempt: failed, naming the loss
    config.max_attempts = 2
    assert store.claim_job("w", job.id).attempts == 2
    last = JobRunner(store, config, job.id, 2)
    last.build = lost
    assert last.run() == 0
    failed = store.get_job(None, job.id)
    assert (failed.status, failed.error_code) == ("failed", "ray_actors_lost")
    assert failed.error_message.startswith("its Ray actors were lost with their node or worker process")
    assert "on attempt 2 of 2: the learner's step failed" in failed.error_message


class FakeRay:
    """``get``/``wait`` over refs that are the errors their calls end with (None: a result)."""

    def get(self, refs):
        for ref in refs if isinstance(refs, list) else [refs]:
            if ref is not None:
                raise ref
        return ["result" for _ in refs] if isinstance(refs, list) else "result"

    def wait(self, refs, num_returns, timeout):
        return refs, []


def test_a_broken_collective_is_reported_as_its_lost_peer():
    from openrft.runtime.ray_faults import get_naming_the_lost

    broken = exceptions.RayTaskError("train", "Traceback", RuntimeError("gloo: Connection closed by peer"))
    peer = exceptions.ActorUnavailableError("node died", None)
    with pytest.raises(exceptions.ActorUnavailableError) as raised:
        get_naming_the_lost(FakeRay(), [broken, peer])  # the survivor's error comes first
    assert raised.value.__cause__ is broken and lost_actors(raised.value) is not None
    with pytest.raises(exceptions.RayTaskError):  # no peer lost: the job's own error, as it was
        get_naming_the_lost(FakeRay(), [broken, None])
    assert get_naming_the_lost(FakeRay(), [None, None]) == ["result", "result"]
