"""The Nova dialect's entry in the registry: a Nova job is an RFT recipe (``nova.py``), an MTRL (multi-turn,
agentic) recipe (``mtrl.py``) or Bedrock's request for a Nova job (``bedrock.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openrft.spec.dialects.bedrock import is_bedrock_request, parse_bedrock
from openrft.spec.dialects.common import DatasetSizer
from openrft.spec.dialects.mtrl import is_mtrl_recipe, parse_mtrl
from openrft.spec.dialects.nova import parse_recipe
from openrft.spec.dialects.registry import Dialect, DocumentFields, register
from openrft.spec.provenance import Resolution


def _resolve_nova(document: Any, base_dir: Path, source: str | None, _files: Any, sizer: DatasetSizer) -> Resolution:
    """A Nova job: Bedrock's request for one, an MTRL (multi-turn, agentic) recipe, or an RFT recipe."""
    if isinstance(document, dict) and is_bedrock_request(document):
        return parse_bedrock(document, base_dir, source, sizer)
    if is_mtrl_recipe(document):
        return parse_mtrl(document, base_dir, source, sizer)
    return parse_recipe(document, base_dir, source, sizer)


def _is_nova(document: Any) -> bool:
    return isinstance(document, dict) and (
        "training_config" in document or "run" in document or is_bedrock_request(document)
    )


register(
    Dialect(
        "nova",
        _is_nova,
        _resolve_nova,
        DocumentFields(
            train="run.data_s3_path",
            validation="run.validation_data_s3_path",
            model="run.model_name_or_path",
            reward="training_config.rollout.rewards",
            output="run.output_s3_path",
            tracking="run",
            replicas="run.replicas",
            user_metadata="labels",
        ),
        order=10,
    )
)
