"""A tenant's job on Ray: its actors do not see the operator's credentials, although a Ray worker inherits its
node's environment (the job process itself drops them: tests/service/test_tenant_tools.py)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import os, ray
from openrft.calls.credentials import drop_operator_secrets, ray_worker_env
from openrft.calls.outbound import POLICY_ENV, tenant_job
if os.environ.get("AS_TENANT"):
    drop_operator_secrets(os.environ)
    tenant_job(os.environ, allow_private=False)
worker_env = ray_worker_env()
os.environ["OPENRFT_GENERATOR_API_KEY"] = "operator-key"  # what the node's workers inherit
runtime_env = {"env_vars": worker_env} if worker_env else None
ray.init(address="local", num_cpus=1, include_dashboard=False, runtime_env=runtime_env)
seen = ray.get(ray.remote(lambda: (os.environ.get("OPENRFT_GENERATOR_API_KEY"), os.environ.get(POLICY_ENV))).remote())
print("SEEN", repr(seen))
ray.shutdown()
"""


def probe(as_tenant: bool) -> str:
    env = {**os.environ, "OPENRFT_GENERATOR_API_KEY": "operator-key", "RAY_ADDRESS": ""}
    env.pop("OPENRFT_TENANT_JOB", None)
    env.pop("OPENRFT_OUTBOUND_POLICY", None)
    if as_tenant:
        env["AS_TENANT"] = "1"
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=240)
    line = next((line for line in done.stdout.splitlines() if line.startswith("SEEN ")), None)
    assert line is not None, done.stdout + done.stderr
    return line


def test_a_tenants_ray_workers_get_the_operators_secrets_blank_and_the_operators_own_keep_them():
    """And a tenant's workers apply its outbound policy when they call out (openrft.calls.transport)."""
    assert probe(as_tenant=True) == "SEEN ('', 'public')"
    assert probe(as_tenant=False) == "SEEN ('operator-key', None)"
