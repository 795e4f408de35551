"""The operator's credentials that a client sends to whatever URL it calls, and keeping them from tenants' jobs.

The service's processes inherit the operator's environment. Some variables there are credentials that a client
sends to the URL it is given: the generator key (``OPENRFT_GENERATOR_API_KEY``, sent to
``rollout.generator_base_url``) and MLflow's and Databricks' (sent by MLflow's client to
``tracking.mlflow_tracking_uri``). In a tenant's job those URLs are the tenant's, so the job process removes
them from its own environment (``drop_operator_secrets``) and blanks the known ones in the Ray workers that run
its actors (``ray_worker_env``): a Ray worker inherits its node's environment, not the job process's. Judge
keys (judges are called only at the operator's ``judge.base_url``) and object-store credentials (reached only
under the prefixes the operator allowed) stay.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from openrft.calls.outbound import POLICY_ENV

SECRET_NAMES = ("OPENRFT_GENERATOR_API_KEY",)
SECRET_PREFIXES = ("MLFLOW_TRACKING_", "DATABRICKS_")
KEPT = ("MLFLOW_TRACKING_URI",)  # an address, not a credential (a tenant's job names its own URI)
# what a Ray worker of a tenant's job gets blank: the names a node's environment may hold
KNOWN_SECRETS = (
    "OPENRFT_GENERATOR_API_KEY",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_CLIENT_CERT_PATH",
    "MLFLOW_TRACKING_SERVER_CERT_PATH",
    "DATABRICKS_TOKEN",
    "DATABRICKS_HOST",
    "DATABRICKS_CLIENT_ID",
    "DATABRICKS_CLIENT_SECRET",
    "DATABRICKS_USERNAME",
    "DATABRICKS_PASSWORD",
)
TENANT_JOB = "OPENRFT_TENANT_JOB"  # set in a tenant's job process: its Ray workers get the secrets blank


def is_tenant_secret(name: str) -> bool:
    """Whether ``name`` holds a credential that a client would send to a URL a tenant wrote."""
    return name not in KEPT and (name in SECRET_NAMES or name.startswith(SECRET_PREFIXES))


def drop_operator_secrets(environ: MutableMapping[str, str]) -> list[str]:
    """Remove those variables from ``environ`` and mark it a tenant's; the names removed (for the job's log)."""
    names = sorted(name for name in environ if is_tenant_secret(name))
    for name in names:
        del environ[name]
    environ[TENANT_JOB] = "1"
    return names


def ray_worker_env() -> dict[str, str] | None:
    """The ``env_vars`` of a Ray ``runtime_env`` for this process's actors: in a tenant's job, every known
    secret blank (a blank key is never sent) and the job's outbound policy; None elsewhere."""
    if os.environ.get(TENANT_JOB) != "1":
        return None
    # and the job's outbound policy (``openrft.calls.outbound.POLICY_ENV``): its actors call out too
    return {name: "" for name in KNOWN_SECRETS} | {POLICY_ENV: os.environ.get(POLICY_ENV, "")}
