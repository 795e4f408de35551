"""Nova recipes as a job body (YAML or JSON): ``POST /v1/nova/jobs`` queues the recipe in the same store
and answers with the OpenAI job object (follow it with the OpenAI or Vertex routes)."""

from __future__ import annotations

from typing import Annotated

import yaml
from fastapi import APIRouter, Depends, Request

from openrft.service.auth import current_owner
from openrft.service.errors import ApiError
from openrft.service.schemas import FineTuningJob
from openrft.service.views import openai_job
from openrft.spec.document_limits import DocumentLimitError, load_yaml

router = APIRouter(prefix="/v1/nova", tags=["nova"])
Owner = Annotated[str, Depends(current_owner)]
RECIPE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/yaml": {"schema": {"type": "string", "description": "a Nova RFT recipe"}},
            "application/json": {"schema": {"type": "object", "description": "a Nova RFT recipe as JSON"}},
        },
    }
}


@router.post("/jobs", response_model=FineTuningJob, openapi_extra=RECIPE_BODY)
async def create_nova_job(request: Request, owner: Owner) -> FineTuningJob:
    raw = await request.body()
    try:
        document = load_yaml(raw.decode("utf-8"), "the recipe")
    except DocumentLimitError as exc:
        raise ApiError(400, str(exc), "document_too_complex") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ApiError(400, f"the recipe is not valid YAML or JSON{where}: {exc}", "invalid_recipe") from None
    if not isinstance(document, dict):
        raise ApiError(400, "the recipe must be a mapping with run and training_config", "invalid_recipe")
    from starlette.concurrency import run_in_threadpool

    job = await run_in_threadpool(request.app.state.submitter.create, owner, document, "nova")
    return openai_job(job, request.app.state.config.ray_address)
