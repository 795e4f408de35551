"""The composition root (``openrft.runtime``): which runtime a job gets, for every caller, and what it asks for.

Nothing here connects to Ray: a ``RayRuntime`` connects when it builds the learner (tests/async and
tests/service/test_cluster.py run them on real clusters)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from openrft.cli.service_options import ray_address
from openrft.engine.local_runtime import LocalRuntime
from openrft.errors import OpenRFTError
from openrft.runtime import job_resources, placed_runtime, runtime_factory, runtime_for
from openrft.runtime.placement import bundles, generation_actors
from openrft.spec.dialects import load_job

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "arithmetic" / "recipe.yaml"
RUNTIMES = {"LocalParallelRuntime", "LocalRuntime", "RayRuntime", "TorchrunRuntime"}


def _spec(**rollout):
    spec = load_job(RECIPE)
    for name, value in rollout.items():
        setattr(spec.rollout, name, value)
    return spec


def test_a_local_spec_gets_the_local_runtime_and_a_ray_spec_the_ray_one():
    pytest.importorskip("ray")
    from openrft.runtime.ray_runtime import RayRuntime

    assert isinstance(runtime_for(_spec()), LocalRuntime)
    on_ray = _spec(runtime="ray", ray_address="10.0.0.5:6379")
    runtime = runtime_for(on_ray)
    assert isinstance(runtime, RayRuntime) and runtime.address == "10.0.0.5:6379"
    assert runtime.address_field == "rollout.ray_address"


def test_the_operators_cluster_places_every_job_on_ray_except_a_colocated_vllm_engine():
    pytest.importorskip("ray")
    from openrft.runtime.ray_runtime import RayRuntime

    spec = _spec()  # runtime local, as written
    runtime = runtime_factory(cluster="head:6379")(spec)
    assert isinstance(runtime, RayRuntime) and runtime.address == "head:6379"
    assert runtime.address_field == "the server's --ray-address"
    assert spec.rollout.runtime == "ray"  # recorded on the spec: the run directory says where it ran
    tenant_named = _spec(runtime="ray", ray_address="evil:1")  # the server's cluster wins over any in the spec
    assert runtime_for(tenant_named, cluster="head:6379").address == "head:6379"
    vllm = _spec(engine="vllm")  # vLLM's engine lives in the learner's process: the job process keeps it
    assert placed_runtime(vllm, "head:6379") == "local"
    assert isinstance(runtime_for(vllm, cluster="head:6379"), LocalRuntime)


def test_a_sharded_learner_outside_torchrun_and_ray_is_refused_by_name():
    with pytest.raises(OpenRFTError, match=r"learner_sharding is 'fsdp'.*torchrun"):
        runtime_for(_spec(learner_sharding="fsdp"))


def test_resources_are_computed_from_the_spec_before_the_job_starts():
    spec = _spec(runtime="ray", replicas=2)
    spec.runtime.threads, spec.runtime.device = 2, "cpu"
    asked = job_resources(spec, "head:6379")
    assert asked.as_dict() == {
        "runtime": "ray",
        "learners": 2,
        "generation_replicas": 0,  # sync rollouts from the local engine: the learners sample
        "cpu": 4.0,
        "gpu": 0.0,
        "ray_address_set": True,
        "bundles": [{"CPU": 2.0}, {"CPU": 2.0}],
    }
    spec.rollout.strategy, spec.rollout.generation_replicas = "off_policy_async", 3
    spec.runtime.threads, spec.runtime.device = None, "cuda"
    assert generation_actors(spec) == 3
    asked = job_resources(spec, None)
    assert (asked.learners, asked.generation_replicas, asked.cpu, asked.gpu) == (2, 3, 5.0, 5.0)
    assert not asked.ray_address_set and asked.bundles == [{"CPU": 1.0, "GPU": 1.0}] * 5
    spec.runtime.device = "auto"  # one GPU a bundle only where the cluster has one for each
    assert job_resources(spec, "auto").gpu is None
    assert bundles(spec, cluster_gpus=4) == [{"CPU": 1.0}] * 5 and bundles(spec, 5)[0] == {"CPU": 1.0, "GPU": 1.0}
    local = job_resources(_spec(), None)
    assert (local.runtime, local.learners, local.cpu, local.bundles) == ("local", 1, None, [])
    assert job_resources(_spec(), "auto").runtime == "ray"  # a cluster places local jobs on it too


def test_ray_address_option_names_the_flag_the_value_and_the_forms():
    for good in ("auto", "10.0.0.5:6379", "ray://head:10001", "head-node.internal:6379"):
        assert ray_address(good) == good
    assert ray_address(None) is None
    for bad in ("http://head:6379", "head", "ray://", "a b:1"):
        with pytest.raises(OpenRFTError, match=r"--ray-address .*expected auto, HOST:PORT"):
            ray_address(bad)


def test_only_the_composition_root_builds_runtimes():
    """Every caller (CLI, service, benchmarks, scripts) asks ``openrft.runtime.runtime_for``: no other module
    constructs a runtime (the engine's default ``LocalRuntime()`` for a caller that passes none aside)."""
    allowed = {ROOT / "src/openrft/runtime/__init__.py", ROOT / "src/openrft/engine/job.py"}
    found = []
    for folder in ("src/openrft", "benchmarks", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            if path in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name in RUNTIMES:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}(...)")
    assert found == []


def test_an_address_nothing_answers_at_is_named_before_ray_would_retry_it_for_minutes():
    import socket

    from openrft.runtime.cluster_address import unreachable

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert unreachable(f"127.0.0.1:{port}") is None
    assert unreachable(f"127.0.0.1:{port}", timeout_s=2).startswith(f"nothing answers at 127.0.0.1:{port}")
    assert unreachable("auto") is None and unreachable("ray://head:10001") is None and unreachable(None) is None
    pytest.importorskip("ray")
    runtime = runtime_for(_spec(), cluster=f"127.0.0.1:{port}")
    with pytest.raises(OpenRFTError, match=r"the server's --ray-address '127\.0\.0\.1:\d+': cannot connect .*nothing"):
        runtime._connect()


def test_a_ray_client_connection_the_heads_proxy_aborted_is_tried_again_and_only_a_ray_client_one(monkeypatch):
    """The head's client proxy starts a server process per connection; on a loaded head one died while starting
    (CI, stop 53: "Starting Ray client server failed"). ``init_ray`` tries a ``ray://`` address again; a GCS
    address, whose failures are not that, is tried once, and the last try's error is Ray's own."""
    ray = pytest.importorskip("ray")
    from openrft.runtime.cluster_address import init_ray

    calls: list[dict] = []

    def init(**kwargs):
        calls.append(kwargs)
        if len(calls) < fails:
            raise ConnectionAbortedError("Initialization failure from server")

    monkeypatch.setattr(ray, "init", init)
    fails = 3
    init_ray("ray://head:10001", retry_s=0, namespace="openrft")
    assert [c["address"] for c in calls] == ["ray://head:10001"] * 3 and calls[0]["namespace"] == "openrft"
    calls.clear()
    fails = 9
    with pytest.raises(ConnectionAbortedError):
        init_ray("ray://head:10001", retry_s=0)
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(ConnectionAbortedError):
        init_ray("head:6379", retry_s=0)
    assert len(calls) == 1
