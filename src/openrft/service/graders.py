"""Graders run/validate (OpenAI) and reward validation (Vertex), delegated to the rewards package."""

from __future__ import annotations

from typing import Any

from openrft.errors import OpenRFTError
from openrft.service.errors import ApiError
from openrft.spec.errors import SpecError


def _unavailable(what: str) -> ApiError:
    return ApiError(400, f"{what} is not available in this build of OpenRFT", "not_available")


def _call(function_name: str, *args: Any) -> dict[str, Any]:
    from openrft import rewards

    function = getattr(rewards, function_name, None)
    if function is None:
        raise _unavailable(function_name)
    try:
        return function(*args)
    except SpecError as exc:
        from openrft.service.errors import from_spec_error

        raise from_spec_error(exc, "invalid_grader") from None
    except OpenRFTError as exc:
        raise ApiError(400, str(exc), "invalid_grader") from None


def run(grader: dict[str, Any], model_sample: str, item: Any, reference_answer: Any) -> dict[str, Any]:
    return _call("run_grader", grader, model_sample, item, reference_answer)


def validate(grader: dict[str, Any]) -> dict[str, Any]:
    return _call("validate_grader", grader)


def validate_vertex_reward(body: dict[str, Any]) -> dict[str, Any]:
    return _call("validate_vertex_reward", body)
