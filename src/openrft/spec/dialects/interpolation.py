"""A Nova recipe as its launchers read it: OmegaConf interpolation resolved, blank values unset.

The HyperPod and SageMaker launchers load a recipe with OmegaConf (Hydra), so a published recipe may
write ``save_steps: ${oc.select:training_config.trainer.max_steps}`` or ``lambda_arn:
${oc.select:run.reward_lambda_arn}``. They are resolved here with the ``omegaconf`` library itself,
each value on its own so that every bad reference is reported at once, before the recipe is validated.

Templates leave fields blank (``output_s3_path: ""``, ``reward_lambda_arn:``): a blank value is unset,
so the field takes its default, or is reported as required. ``null`` stays ``null`` where the field
allows it (``peft_scheme: null`` means full-rank training, ``reasoning_effort: null`` no reasoning).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

from openrft.spec.errors import FieldProblem, join_path


def has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, dict):
        return any(has_interpolation(v) for v in value.values())
    if isinstance(value, list):
        return any(has_interpolation(v) for v in value)
    return False


def resolve_interpolation(raw: dict[str, Any]) -> tuple[dict[str, Any], list[FieldProblem]]:
    """``raw`` with every ``${...}`` resolved as OmegaConf resolves it; a value that cannot be resolved is
    dropped (its default applies) and reported at its path."""
    if not has_interpolation(raw):
        return raw, []
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        config = OmegaConf.create(raw)
    except OmegaConfBaseException as exc:
        return raw, [FieldProblem("<root>", f"cannot be read as an OmegaConf config: {_first_line(exc)}")]
    problems: list[FieldProblem] = []

    def walk(node: Any, path: list[Any]) -> Any:
        keys = list(node.keys()) if isinstance(node, DictConfig) else list(range(len(node)))
        out: Any = {} if isinstance(node, DictConfig) else []
        for key in keys:
            try:
                value = node[key]
            except OmegaConfBaseException as exc:
                text = node._get_node(key)._value() if hasattr(node, "_get_node") else "?"
                problems.append(FieldProblem(join_path([*path, key]), f"cannot be resolved: {_first_line(exc)}", text))
                continue
            if isinstance(value, DictConfig | ListConfig):
                value = walk(value, [*path, key])
            if isinstance(out, dict):
                out[key] = value
            else:
                out.append(value)
        return out

    return walk(config, []), problems


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def drop_blanks(raw: Any, model: type[BaseModel] | None) -> Any:
    """``raw`` without its blank values: empty strings everywhere, and ``null`` where ``model``'s field
    does not allow ``None`` (a template's blank). Unknown keys are kept for validation to report."""
    if isinstance(raw, list):
        return [drop_blanks(v, _inner_model(None)) for v in raw]
    if not isinstance(raw, dict):
        return raw
    out = {}
    for key, value in raw.items():
        field = model.model_fields.get(key) if model is not None else None
        if isinstance(value, str) and value.strip() == "":
            continue
        if value is None and field is not None and not _allows_none(field.annotation):
            continue
        out[key] = drop_blanks(value, _inner_model(field.annotation if field is not None else None))
    return out


def _allows_none(annotation: Any) -> bool:
    if annotation is None or annotation is type(None):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _allows_none(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_allows_none(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return None in typing.get_args(annotation)
    return annotation is typing.Any


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (through Optional/Annotated), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _inner_model(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            inner = _inner_model(arg)
            if inner is not None:
                return inner
    return None
