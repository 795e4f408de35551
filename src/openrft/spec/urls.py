"""Which fields of a job are places the service calls out to, marked where they are declared.

A field whose value is a URL the job's process will call (or a location it may read or write) is declared
with one of the annotated types below. The service's tenancy rules walk a job with ``url_values`` and check
every marked value once, so a URL field cannot be added without being checked: a test lists every field
whose name says it holds an address and fails when one is not marked.

Roles:

- ``outbound``: a URL the job calls (a generator server, an MLflow server, a tool or MCP endpoint); a
  tenant's must pass the outbound policy (``openrft.calls.outbound``);
- ``location``: a path or a URL (datasets, the output); checked like ``outbound`` when it is a URL;
- ``operator``: the operator's alone (the Ray cluster, a judge's endpoint): a tenant may not set it;
- ``reward``: a reward kind's endpoint, checked by that kind's declared needs (``rewards.types.needs_of``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin
from urllib.parse import urlparse

from pydantic import AfterValidator, BaseModel

Role = Literal["outbound", "location", "operator", "reward"]


@dataclass(frozen=True)
class UrlField:
    role: Role


def one_http_url(value: str) -> str:
    """One http(s) URL with a host: never a list in one string, never another scheme."""
    if any(c.isspace() or c == "," for c in value):
        raise ValueError(
            f"{value!r} is not one URL (it holds a comma or a space): name one server per entry; several "
            "servers are a list of URLs"
        )
    parsed = urlparse(value)
    try:
        host = parsed.hostname
    except ValueError:
        host = None
    if parsed.scheme.lower() not in ("http", "https") or not host:
        raise ValueError(f"{value!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1")
    return value


OutboundUrl = Annotated[str, UrlField("outbound")]
HttpUrl = Annotated[str, AfterValidator(one_http_url), UrlField("outbound")]
Location = Annotated[str, UrlField("location")]
OperatorUrl = Annotated[str, UrlField("operator")]
RewardUrl = Annotated[str, UrlField("reward")]


def _marker(metadata: list[Any]) -> UrlField | None:
    return next((m for m in metadata if isinstance(m, UrlField)), None)


def _annotation_marker(annotation: Any) -> UrlField | None:
    """The marker of ``Annotated[str, UrlField(...)]`` found anywhere inside ``annotation`` (Optional, list)."""
    if get_origin(annotation) is Annotated:
        found = _marker(list(get_args(annotation)[1:]))
        if found is not None:
            return found
    return next((m for arg in get_args(annotation) if (m := _annotation_marker(arg)) is not None), None)


def url_values(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, str, UrlField]]:
    """Every set value of a marked field in ``model`` and the models inside it: (dotted path, value, marker)."""
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        path = f"{prefix}{name}"
        marker = _marker(info.metadata) or _annotation_marker(info.annotation)
        if marker is not None:
            if isinstance(value, str):
                yield path, value, marker
            elif isinstance(value, list):  # one URL is named as the field (it was most likely written alone)
                for i, item in enumerate(value):
                    yield (f"{path}.{i}" if len(value) > 1 else path), item, marker
            continue
        yield from _nested(value, path)


def _nested(value: Any, path: str) -> Iterator[tuple[str, str, UrlField]]:
    if isinstance(value, BaseModel):
        yield from url_values(value, f"{path}.")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _nested(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _nested(item, f"{path}.{i}")


def declared_fields(model_class: type[BaseModel]) -> Iterator[tuple[type[BaseModel], str, UrlField | None]]:
    """Every field of ``model_class`` and of the model classes its fields hold (unions, lists, dicts): (class,
    field name, marker or None). For the test that no address field goes unmarked."""
    seen: set[type[BaseModel]] = set()
    pending = [model_class]
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for name, info in cls.model_fields.items():
            yield cls, name, _marker(info.metadata) or _annotation_marker(info.annotation)
            pending += list(_model_classes(info.annotation))


def _model_classes(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _model_classes(arg)
