"""The operator's secrets stay out of a tenant's job process.

The job process inherits the server's environment, where the operator keeps credentials for the operator's
own endpoints. Some are read by whatever client calls a URL: the generator key (``OPENRFT_GENERATOR_API_KEY``,
sent to ``rollout.generator_base_url``) and MLflow's and Databricks' credentials (sent by MLflow's client to
``tracking.mlflow_tracking_uri``). In a tenant's job those URLs are the tenant's, so these variables are removed
before anything runs: a tenant's host never receives them. Judge keys (``judge.base_url`` is the operator's
alone) and object-store credentials (reached only under the prefixes the operator allowed) stay.
"""

from __future__ import annotations

from collections.abc import MutableMapping

SECRET_NAMES = ("OPENRFT_GENERATOR_API_KEY",)
SECRET_PREFIXES = ("MLFLOW_TRACKING_", "DATABRICKS_")
KEPT = ("MLFLOW_TRACKING_URI",)  # an address, not a credential (a tenant's job names its own URI)


def is_tenant_secret(name: str) -> bool:
    """Whether ``name`` holds a credential that a client would send to a URL a tenant wrote."""
    return name not in KEPT and (name in SECRET_NAMES or name.startswith(SECRET_PREFIXES))


def drop_operator_secrets(environ: MutableMapping[str, str]) -> list[str]:
    """Remove those variables from ``environ``; the names removed (for the job's log)."""
    names = sorted(name for name in environ if is_tenant_secret(name))
    for name in names:
        del environ[name]
    return names
