"""Load a JSONL dataset, validating every line and reporting all bad lines at once."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrft.data.records import Example
from openrft.data.validation import parse_record
from openrft.data.vertex_format import is_vertex_record, parse_vertex_record
from openrft.errors import OpenRFTError
from openrft.spec.dialects.common import DatasetUnreadable
from openrft.spec.job import held_out_count
from openrft.spec.locations import is_remote
from openrft.storage import StorageError, read_bytes
from openrft.textlines import LinesUnreadable, text_lines

MAX_REPORTED = 50

RecordParser = Callable[[Any, int, bool], tuple[Example | None, list[tuple[str, str]]]]


@dataclass(frozen=True)
class LineProblem:
    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        if self.line == 0:  # the file as a whole
            return f"{self.file}: {self.message}"
        return f"{self.file}:{self.line}: {self.field}: {self.message}"


class DatasetError(OpenRFTError):
    def __init__(self, location: str, problems: list[LineProblem]):
        self.location = location
        self.problems = problems
        shown = "\n".join(f"  - {p}" for p in problems[:MAX_REPORTED])
        more = f"\n  ... and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
        super().__init__(f"{location}: {len(problems)} invalid line(s):\n{shown}{more}")


def open_lines(location: str) -> list[str]:
    """The lines of a local file or of an object at a URI (``s3://``, ``gs://``, ... through fsspec), read as
    exported files come (``openrft.textlines``: compression, byte-order marks, encodings, line endings); a
    missing file, object or bucket, or bytes that are not text, is one clear error naming it and the line."""
    try:
        if is_remote(location) or location.startswith("file://"):
            data = read_bytes(location)
        else:
            path = Path(location)
            if not path.is_file():
                raise DatasetError(location, [LineProblem(location, 0, "<file>", "does not exist or is not a file")])
            data = path.read_bytes()
        return text_lines(data)
    except StorageError as exc:
        raise DatasetError(location, [LineProblem(location, 0, "<file>", exc.reason)]) from None
    except OSError as exc:
        raise DatasetError(location, [LineProblem(location, 0, "<file>", f"cannot be read ({exc.strerror})")]) from None
    except LinesUnreadable as exc:
        raise DatasetError(location, [LineProblem(location, exc.line, "<line>", exc.reason)]) from None


def count_examples(location: str) -> int:
    """Non-blank lines of a dataset at a path or URI: the job resolver's ``dataset_size`` where datasets may
    live in an object store (the spec layer itself reads local files only)."""
    try:
        return sum(1 for line in open_lines(location) if line.strip())
    except DatasetError as exc:
        problem = exc.problems[0]
        raise DatasetUnreadable(
            f"line {problem.line}: {problem.message}" if problem.line else problem.message
        ) from None


def parse_lines(
    lines: Iterable[str], location: str, require_reference: bool, parser: RecordParser = parse_record
) -> list[Example]:
    examples: list[Example] = []
    problems: list[LineProblem] = []
    ids: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            message = f"is not valid JSON ({exc.msg}, column {exc.colno})"
            problems.append(LineProblem(location, number, "<line>", message))
            continue
        except RecursionError:
            problems.append(LineProblem(location, number, "<line>", "nests too deeply to be read"))
            continue
        example, line_problems = parser(obj, number, require_reference)
        problems += [LineProblem(location, number, field, message) for field, message in line_problems]
        if example is None:
            continue
        if example.id in ids:
            problems.append(LineProblem(location, number, "id", f"{example.id!r} repeats line {ids[example.id]}"))
            continue
        ids[example.id] = number
        examples.append(example)
    if not examples and not problems:
        problems.append(LineProblem(location, 0, "<file>", "holds no examples"))
    if problems:
        raise DatasetError(location, problems)
    return examples


def detect_parser(lines: list[str]) -> RecordParser:
    """The record format of a file, from its first line that is a JSON object: Vertex or messages."""
    for text in lines:
        if not text.strip():
            continue
        try:
            first = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(first, dict):
            return parse_vertex_record if is_vertex_record(first) else parse_record
    return parse_record


def load_dataset(location: str, require_reference: bool = False, limit: int | None = None) -> list[Example]:
    """Every example of a JSONL file in the messages or Vertex format (detected per file), or a DatasetError
    listing every invalid line. ``limit``: a file with more examples is an error."""
    lines = list(open_lines(location))
    examples = parse_lines(lines, location, require_reference, detect_parser(lines))
    if limit is not None and len(examples) > limit:
        raise DatasetError(
            location,
            [LineProblem(location, 0, "<file>", f"holds {len(examples):,} examples; this job takes at most {limit:,}")],
        )
    return examples


def split_validation(
    examples: list[Example], fraction: float, minimum: int, seed: int, maximum: int | None = None
) -> tuple[list[Example], list[Example]]:
    """Hold out ``max(fraction * n, minimum)`` examples (capped by ``maximum`` and at half the set)."""
    count = held_out_count(len(examples), fraction, minimum, maximum)
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    held = set(order[:count])
    train = [e for i, e in enumerate(examples) if i not in held]
    validation = [e for i, e in enumerate(examples) if i in held]
    return train, validation
