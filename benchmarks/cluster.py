"""The job service on a Ray cluster against its embedded single worker (issue 45): the same eight short demo jobs of
two tenants, submitted through the Nova route of a real ``openrft serve`` on 127.0.0.1, once with the server
pointed at a 3-node local Ray cluster (``--ray-address``) and once with the embedded worker running one job at a
time (the default without a cluster).

    python -m benchmarks cluster [--cluster-steps 12] [--cluster-reward-delay 1.0]
    python -m benchmarks.cluster [same options]

The jobs' reward is a Nova-contract endpoint on 127.0.0.1 (examples/reward_server/server.py) that answers each call
after ``--cluster-reward-delay`` seconds, so that a job spends most of its time waiting and jobs overlap on two
cores. Tenant A submits six jobs, then tenant B two. The cluster has three nodes (``ray.cluster_utils.Cluster``:
a head of two CPUs and two workers of one); each job asks for one learner of one CPU, so at most four run at once.

Figures (one JSON line on stdout; ``benchmarks/results/cluster.{md,json}``):

- ``makespan_s``: from the first submission to the last job's end, on the cluster; ``single_worker_makespan_s``
  the same on the embedded single worker; ``makespan_ratio`` the second over the first (goal at least 2).
- ``fairness``: Jain's index of the two tenants' CPU-seconds held, each over its max-min fair share's (the
  cluster's CPUs split evenly, capped by what a tenant's unfinished jobs could use), over the time both tenants
  have work queued or running (goal at least 0.9). Serving arrivals in order, A's six jobs would hold the cluster
  while B waits.
- ``tenant_b_first_wait_s``: from B's first submission to its start (goal at most one job's duration, the median
  ``job_duration_s`` on the cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import ROOT, load_average, markdown_table, write_results
from benchmarks.service_latency import CLI, free_port

TRAIN = ROOT / "examples" / "arithmetic" / "train.jsonl"
JOBS_A, JOBS_B = 6, 2
CLUSTER_CPUS = 4.0  # three_nodes(): 2 + 1 + 1
TERMINAL = ("succeeded", "failed", "cancelled")


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument("--cluster-steps", type=int, default=12, help="training steps of each job")
    group.add_argument("--cluster-reward-delay", type=float, default=1.0, help="seconds the reward endpoint waits")


def _wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{what} did not start")


def _reward_server(delay: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = ROOT / "examples" / "reward_server" / "server.py"
    args = [sys.executable, str(server), "--port", str(port), "--delay", str(delay)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    _wait_http(url, proc, "the reward server")
    return proc, url


def _recipe(name: str, train: str, reward_url: str, steps: int) -> dict:
    """The demo job, short: 4 prompts x 4 samples a step, one reward call a step, no evaluation."""
    return {
        "run": {"name": name, "model_name_or_path": "openrft-demo", "data_s3_path": train},
        "training_config": {
            "max_length": 96,
            "global_batch_size": 16,
            "rollout": {
                "advantage_strategy": {"number_generation": 4},
                "generator": {"max_new_tokens": 6, "temperature": 1.0},
                "rewards": {"api_endpoint": {"lambda_arn": reward_url, "lambda_batch_size": 16}},
            },
            "trainer": {
                "max_steps": steps,
                "save_steps": steps,
                "optim_config": {"lr": 1e-3},
                "peft": {"peft_scheme": "lora"},
            },
        },
        "openrft": {"max_train_examples": 4 * steps, "tensorboard": False, "threads": 1, "device": "cpu"},
    }


def run_jobs(root: Path, extra: list[str], reward_url: str, steps: int, log=print) -> dict:
    """Start a server on ``root`` (``extra``: its options), submit A's six jobs then B's two, wait for all; the
    jobs' timelines from the store (created, started, finished: seconds)."""
    from openrft.service.store import Store

    database = f"sqlite:///{root / 'openrft.db'}"
    store = Store.open(database)
    keys = {tenant: store.create_key(tenant) for tenant in ("tenant-a", "tenant-b")}
    port = free_port()
    args = [
        *("serve", "--port", str(port), "--log-level", "warning", "--allow-private-urls"),
        *("--data-dir", str(root), "--database-url", database, *extra),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    server_log = (root / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-c", CLI, *args], env=env, stdout=server_log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(base + "/health", proc, "the server")
        clients = {
            tenant: httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=60)
            for tenant, (_key, secret) in keys.items()
        }
        trains = {}
        for tenant, client in clients.items():
            with TRAIN.open("rb") as f:
                uploaded = client.post("/v1/files", files={"file": f}, data={"purpose": "fine-tune"})
            uploaded.raise_for_status()
            trains[tenant] = uploaded.json()["id"]
        submitted: list[tuple[str, str]] = []
        t0 = time.time()
        for tenant, count in (("tenant-a", JOBS_A), ("tenant-b", JOBS_B)):
            for i in range(count):
                recipe = _recipe(f"{tenant}-{i}", trains[tenant], reward_url, steps)
                created = clients[tenant].post("/v1/nova/jobs", json=recipe)
                if created.status_code != 200:
                    raise RuntimeError(f"{tenant}'s job refused: {created.text}")
                submitted.append((tenant, created.json()["id"]))
        deadline = time.monotonic() + 3600
        while True:
            done = [store.get_job(None, job_id).status in TERMINAL for _tenant, job_id in submitted]
            if all(done):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"jobs unfinished after an hour or the server ended; see {root / 'serve.log'}")
            time.sleep(0.5)
        jobs = []
        for tenant, job_id in submitted:
            job = store.get_job(None, job_id)
            if job.status != "succeeded":
                raise RuntimeError(f"job {job_id} of {tenant} {job.status}: {job.error_message}")
            jobs.append(
                {
                    "tenant": tenant,
                    "id": job_id,
                    "created": job.created_at - t0,
                    "started": job.started_at - t0,
                    "finished": job.finished_at - t0,
                    "cpu": 1.0,
                }
            )
        log(f"  {len(jobs)} jobs done in {max(j['finished'] for j in jobs):.1f} s")
        return {"jobs": jobs}
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        store.close()


def makespan(jobs: list[dict]) -> float:
    return max(j["finished"] for j in jobs) - min(j["created"] for j in jobs)


def held_against_fair_share(jobs: list[dict], step: float = 0.05) -> dict[str, float]:
    """Each tenant's CPU-seconds held over its max-min fair share's, over the time both tenants have work (a job
    queued or running). The fair share at each moment splits the cluster's CPUs evenly, capped by what a tenant's
    unfinished jobs could use, the rest going to the other (max-min fairness)."""
    capacity = CLUSTER_CPUS
    tenants = sorted({j["tenant"] for j in jobs})
    held = dict.fromkeys(tenants, 0.0)
    fair = dict.fromkeys(tenants, 0.0)
    start = max(min(j["created"] for j in jobs if j["tenant"] == t) for t in tenants)
    end = min(max(j["finished"] for j in jobs if j["tenant"] == t) for t in tenants)
    t = start
    while t < end:
        demand = {
            x: sum(j["cpu"] for j in jobs if j["tenant"] == x and j["created"] <= t < j["finished"]) for x in tenants
        }
        for tenant, share in max_min_shares(demand, capacity).items():
            fair[tenant] += share * step
        for job in jobs:
            if job["started"] <= t < job["finished"]:
                held[job["tenant"]] += job["cpu"] * step
        t += step
    return {tenant: held[tenant] / fair[tenant] if fair[tenant] else 1.0 for tenant in tenants}


def max_min_shares(demand: dict[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair shares of ``capacity`` among ``demand``: equal splits, a tenant never given more than it asks."""
    shares = dict.fromkeys(demand, 0.0)
    left, open_ = capacity, {t for t, d in demand.items() if d > 0}
    while open_ and left > 1e-9:
        each = left / len(open_)
        for tenant in sorted(open_, key=lambda x: demand[x]):
            give = min(each, demand[tenant] - shares[tenant])
            shares[tenant] += give
            left -= give
        open_ = {t for t in open_ if demand[t] - shares[t] > 1e-9}
    return shares


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one has everything (and when none has anything)."""
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1 / len(values)


def three_nodes():
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 2, "resources": {"node_head": 1}, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for name in ("node_a", "node_b"):
        cluster.add_node(num_cpus=1, resources={name: 1})
    cluster.wait_for_nodes()
    return cluster


def measure(steps: int, reward_delay: float, log=print) -> dict:
    reward, reward_url = _reward_server(reward_delay)
    try:
        log("the service on a 3-node Ray cluster (4 CPUs)")
        cluster = three_nodes()
        try:
            with tempfile.TemporaryDirectory(prefix="openrft-cluster-") as tmp:
                on_cluster = run_jobs(
                    Path(tmp), ["--workers", "8", "--ray-address", cluster.address], reward_url, steps
                )
        finally:
            cluster.shutdown()
        log("the embedded single worker (no cluster)")
        with tempfile.TemporaryDirectory(prefix="openrft-single-") as tmp:
            single = run_jobs(Path(tmp), ["--workers", "1"], reward_url, steps)
    finally:
        reward.terminate()
    jobs = on_cluster["jobs"]
    durations = [j["finished"] - j["started"] for j in jobs]
    b_first = min((j for j in jobs if j["tenant"] == "tenant-b"), key=lambda j: j["created"])
    relative = held_against_fair_share(jobs)
    return {
        "makespan_s": makespan(jobs),
        "single_worker_makespan_s": makespan(single["jobs"]),
        "makespan_ratio": makespan(single["jobs"]) / makespan(jobs),
        "fairness": jain(list(relative.values())),
        "held_over_fair_share": relative,
        "tenant_b_first_wait_s": b_first["started"] - b_first["created"],
        "job_duration_s": statistics.median(durations),
        "single_worker_job_duration_s": statistics.median(j["finished"] - j["started"] for j in single["jobs"]),
        "jobs": {"cluster": jobs, "single_worker": single["jobs"]},
    }


def suite(args: argparse.Namespace, log=print) -> dict:
    load_before = load_average()
    result = measure(args.cluster_steps, args.cluster_reward_delay, log)
    result["load"] = {"before": load_before, "after": load_average()}
    result["settings"] = {"steps": args.cluster_steps, "reward_delay_s": args.cluster_reward_delay}
    goals = {
        "makespan_ratio": result["makespan_ratio"] >= 2,
        "fairness": result["fairness"] >= 0.9,
        "tenant_b_first_wait_s": result["tenant_b_first_wait_s"] <= result["job_duration_s"],
    }
    result["goals_met"] = goals
    rows = [
        {
            "where": where,
            "tenant": j["tenant"],
            "id": j["id"],
            "queued": f"{j['created']:.1f}",
            "started": f"{j['started']:.1f}",
            "finished": f"{j['finished']:.1f}",
        }
        for where, jobs in result["jobs"].items()
        for j in jobs
    ]
    body = [
        f"Eight demo jobs ({args.cluster_steps} steps, one reward call a step answered after "
        f"{args.cluster_reward_delay} s), tenant A's six submitted before tenant B's two, through the Nova route.",
        "",
        f"- makespan on the 3-node cluster: {result['makespan_s']:.1f} s; on the embedded single worker: "
        f"{result['single_worker_makespan_s']:.1f} s; ratio **{result['makespan_ratio']:.2f}** (goal >= 2)",
        f"- fairness (Jain's index of each tenant's CPU-seconds over its max-min fair share's, while both had "
        f"work): **{result['fairness']:.3f}** (goal >= 0.9); held over fair share: "
        + ", ".join(f"{t} {v:.2f}" for t, v in sorted(result["held_over_fair_share"].items())),
        f"- tenant B's first job waited **{result['tenant_b_first_wait_s']:.1f} s** (goal <= one job's duration, "
        f"{result['job_duration_s']:.1f} s on the cluster; {result['single_worker_job_duration_s']:.1f} s alone)",
        "",
        "Timelines (seconds from the first submission):",
        "",
        *markdown_table(
            [
                ("where", "where"),
                ("tenant", "tenant"),
                ("id", "job"),
                ("queued", "queued"),
                ("started", "started"),
                ("finished", "finished"),
            ],
            rows,
        ),
    ]
    write_results("cluster", "The service on a 3-node Ray cluster against its single embedded worker", body, result)
    summary = {k: result[k] for k in ("makespan_s", "single_worker_makespan_s", "makespan_ratio", "fairness")}
    summary["tenant_b_first_wait_s"] = result["tenant_b_first_wait_s"]
    summary["job_duration_s"] = result["job_duration_s"]
    print(json.dumps({"benchmark": "cluster", **{k: round(v, 3) for k, v in summary.items()}}), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster")
    add_options(parser)
    suite(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
