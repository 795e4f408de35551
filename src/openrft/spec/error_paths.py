"""The user's own field path of a pydantic error location.

Pydantic puts a step of its own into an error's ``loc`` wherever it validated a union: the tag of a
discriminated union (``grader.multi.graders.a.string_check.operation``) or the label of the member
tried by a plain union (``batch_size.int``, ``content.list[...]``). The user wrote neither. Walking
the location along the model's types tells which steps are such union steps, so they can be dropped:
``grader.graders.a.operation``.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Discriminator, Tag
from pydantic.fields import FieldInfo

_UNKNOWN = object()
"""The type at a step the walk cannot follow (an unknown field, ``Any``): later steps are kept as they are."""

_SEQUENCES = (list, tuple, set, frozenset, Sequence)
_LABELS = {list: "list", tuple: "tuple", dict: "dict", set: "set", frozenset: "frozenset"}


def user_loc(model: Any, loc: Sequence[Any]) -> list[Any]:
    """``loc`` of an error raised while validating ``model`` (a model class or any type), without
    pydantic's union steps."""
    out: list[Any] = []
    tp = model
    for part in loc:
        if tp is _UNKNOWN:
            if not (isinstance(part, str) and part.startswith("function-")):  # a plain union's member label
                out.append(part)
            continue
        tp, discriminator, members = _resolve(tp)
        if members is not None:  # a union: this step is its tag or its member's label
            tp = _member(members, discriminator, part)
            continue
        out.append(part)
        tp = _child(tp, part)
    return out


def _resolve(tp: Any) -> tuple[Any, Any, list[Any] | None]:
    """Strip ``Annotated`` and ``X | None``; for a union of several types, also its discriminator and members."""
    discriminator = None
    while True:
        if get_origin(tp) is Annotated:
            base, *metadata = get_args(tp)
            for meta in metadata:
                if isinstance(meta, FieldInfo) and meta.discriminator is not None:
                    discriminator = meta.discriminator
                elif isinstance(meta, Discriminator):
                    discriminator = meta
            tp = base
        elif get_origin(tp) in (Union, types.UnionType):
            members = [m for m in get_args(tp) if m is not type(None)]
            if len(members) > 1:
                return tp, discriminator, members
            tp = members[0]
        else:
            return tp, None, None


def _member(members: list[Any], discriminator: Any, part: Any) -> Any:
    """The member a union step names: by its tag (discriminated union) or by pydantic's label (plain union)."""
    for member in members:
        if discriminator is not None and part in _tags(member, discriminator):
            return member
        if discriminator is None and isinstance(part, str) and _labelled(member, part):
            return member
    return _UNKNOWN


def _tags(member: Any, discriminator: Any) -> tuple[Any, ...]:
    if get_origin(member) is Annotated:
        tags = tuple(m.tag for m in get_args(member)[1:] if isinstance(m, Tag))
        if tags:
            return tags
    field = discriminator if isinstance(discriminator, str) else None
    base, _, _ = _resolve(member)
    if field and isinstance(base, type) and issubclass(base, BaseModel) and field in base.model_fields:
        annotation = base.model_fields[field].annotation
        return get_args(annotation) if get_origin(annotation) is Literal else ()
    return ()


def _labelled(member: Any, label: str) -> bool:
    """Whether pydantic labels ``member`` of a plain union ``label`` (``int``, ``list[...]``, ``MyModel``, ...)."""
    base, discriminator, members = _resolve(member)
    if members is not None:
        return label.startswith("tagged-union[" if discriminator is not None else "union[")
    if get_origin(base) is Literal:
        return label.startswith("literal[")
    origin = get_origin(base)
    if origin in _LABELS:
        return label.startswith(_LABELS[origin] + "[")
    return isinstance(base, type) and label == base.__name__


def _child(tp: Any, part: Any) -> Any:
    """The type found one step down ``tp`` at ``part`` (a field name, list index or mapping key)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        fields = tp.model_fields
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        if field is None:
            return _UNKNOWN
        return Annotated[field.annotation, field, *field.metadata]  # a discriminator is in one of them
    origin, args = get_origin(tp), get_args(tp)
    if origin is tuple and args and isinstance(part, int):
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        return args[part] if part < len(args) else _UNKNOWN
    if origin in _SEQUENCES and args and isinstance(part, int):
        return args[0]
    if origin in (dict, Mapping) and len(args) == 2:
        return args[1]
    return _UNKNOWN
