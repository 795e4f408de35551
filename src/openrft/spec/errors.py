"""Spec errors that speak the user's dialect: every problem of a request, each naming its field path."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from openrft.errors import OpenRFTError
from openrft.spec.error_paths import user_loc

_MISSING = object()


@dataclass(frozen=True)
class FieldProblem:
    """One problem: the user's own field path (``training_config.global_batch_size``), its value, why.

    ``remedy`` is set on a reference to something only the job's cloud service has (its model, an OpenAI file
    id, a blank Lambda a notebook fills in): what maps it for a run here, an option (``--map-model 'X=MODEL'``)
    or a field to write. Such a job is valid as written (``spec validate``) but does not train until mapped."""

    path: str
    message: str
    value: Any = _MISSING
    remedy: str | None = None

    def __str__(self) -> str:
        if self.value is _MISSING:
            return f"{self.path}: {self.message}"
        return f"{self.path}: {self.value!r} {self.message}"


class SpecError(OpenRFTError):
    """All problems found in one job request, reported together."""

    def __init__(self, problems: Sequence[FieldProblem], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        self.partial: dict[str, tuple[Any, str | None]] = {}
        """What the resolver had set when it stopped (canonical path -> value, the user's field): lets
        ``spec validate`` check the datasets and outputs of a job that does not resolve yet."""
        if len(self.problems) == 1:
            super().__init__(f"{source}: {self.problems[0]}" if source else str(self.problems[0]))
            return
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s){where}:\n{lines}")


def join_path(parts: Iterable[Any], prefix: str = "") -> str:
    """``("trainer", "optim_config", "lr")`` -> ``trainer.optim_config.lr``; list indices as ``[3]``."""
    text = prefix
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text = f"{text}.{part}" if text else str(part)
    return text or "<root>"


def _bound_message(kind: str, ctx: dict[str, Any]) -> str:
    words = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    key = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}[kind]
    return f"must be {words[kind]} {ctx.get(key)}"


def problems_from_validation(error: ValidationError, model: Any, prefix: str = "", skip: int = 0) -> list[FieldProblem]:
    """Translate pydantic's errors from validating ``model`` into user-facing problems with plain wording,
    each at the user's own dotted path (without the union tags pydantic adds, see ``error_paths``).

    ``skip`` drops the first parts of each location: validating ``VertexReward(single=raw)`` with
    ``prefix="reinforcementTuningSpec.singleRewardConfig", skip=1`` names the user's own field.
    """
    problems = []
    for item in error.errors(include_url=False):
        loc = user_loc(model, item["loc"])[skip:]
        path = join_path(loc, prefix)
        kind = item["type"]
        value = item.get("input", _MISSING)
        ctx = item.get("ctx") or {}
        if kind == "extra_forbidden":
            problems.append(FieldProblem(path, "is not a known field"))
        elif kind == "missing":
            problems.append(FieldProblem(path, "is required"))
        elif kind == "literal_error":
            allowed = ctx.get("expected", "")
            problems.append(FieldProblem(path, f"is not one of {allowed.replace(' or ', ', ')}", value))
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            problems.append(FieldProblem(path, _bound_message(kind, ctx), value))
        elif kind == "value_error":
            message = str(ctx.get("error", item["msg"]))
            problems.append(FieldProblem(path, message, value))
        else:
            problems.append(FieldProblem(path, item["msg"][0].lower() + item["msg"][1:], value))
    return problems


def outside(low: float, high: float) -> str:
    """Wording for a value outside a closed range, e.g. ``is outside [0.25, 4]``."""
    return f"is outside [{_number(low)}, {_number(high)}]"


def _number(value: float) -> str:
    """Whole numbers in full (1048576, not 1.04858e+06), others as ``:g``."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"
