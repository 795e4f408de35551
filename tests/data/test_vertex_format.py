"""The Vertex dataset format: conversion to messages, line-numbered problems, detection per file, limits."""

from __future__ import annotations

import json

import pytest

from openrft.data.loader import DatasetError, load_dataset
from openrft.data.vertex_format import parse_vertex_record, to_vertex_record

LINE = {
    "systemInstruction": {"role": "system", "parts": [{"text": "You are a "}, {"text": "calculator."}]},
    "contents": [
        {"role": "user", "parts": [{"text": "What is 2+2?"}]},
        {"role": "model", "parts": [{"text": "4"}]},
        {"role": "user", "parts": [{"text": "What is 17*23?"}]},
    ],
    "references": {"ground_truth_answer": "391"},
    "task_id": "mul-1",
}


def write(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_a_vertex_line_becomes_the_messages_of_the_same_chat():
    example, problems = parse_vertex_record(LINE, 7, require_reference=True)
    assert problems == []
    assert example.messages == [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "What is 17*23?"},
    ]
    assert example.fields == {"references": {"ground_truth_answer": "391"}, "task_id": "mul-1"}
    assert example.reference_answer == {"ground_truth_answer": "391"}
    assert (example.id, example.line, example.tools) == ("line-7", 7, None)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ({"contents": []}, [("contents", "must be a non-empty list of {role, parts} turns")]),
        ({}, [("contents", "is required")]),
        (
            {"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]},
            [("contents[0].role", "'assistant' is not one of user, model")],
        ),
        (
            {"contents": [{"role": "user", "parts": []}]},
            [("contents[0].parts", "must be a non-empty list of {text} parts")],
        ),
        (
            {"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png"}}]}]},
            [("contents[0].parts[0]", "must be a text part {text: ...} (got inlineData); OpenRFT trains on text only")],
        ),
        ({"contents": [{"role": "model", "parts": [{"text": "x"}]}]}, [("contents", "needs at least one user turn")]),
        (
            {"contents": [{"role": "user", "parts": [{"text": "x"}]}], "references": {"a": 1}},
            [("references.a", "must be a string")],
        ),
        (
            {"contents": [{"role": "user", "parts": [{"text": "x"}]}], "references": "391"},
            [("references", "must be a non-empty object of string values")],
        ),
        (
            {"contents": [{"role": "user", "parts": [{"text": "x"}]}]},
            [("references", "is required by this job's reward")],
        ),
        (
            {
                "systemInstruction": "be brief",
                "contents": [{"role": "user", "parts": [{"text": "x"}]}],
                "references": {"a": "b"},
            },
            [("systemInstruction", "must be an object {parts: [{text: ...}]}")],
        ),
    ],
)
def test_problems_name_vertex_fields(line, expected):
    required = any("required by" in message for _, message in expected)
    example, problems = parse_vertex_record(line, 1, require_reference=required)
    assert example is None and problems == expected


def test_format_is_detected_per_file_and_bad_lines_are_reported_with_their_numbers(tmp_path):
    messages = {"messages": [{"role": "user", "content": "What is 17*23?"}], "reference_answer": "391"}
    assert load_dataset(write(tmp_path / "m.jsonl", [messages]))[0].messages[0]["content"] == "What is 17*23?"
    location = write(tmp_path / "v.jsonl", [LINE, "", "{not json", messages, {"contents": [{"role": "user"}]}, LINE])
    with pytest.raises(DatasetError) as info:
        load_dataset(location, require_reference=True)
    assert [str(p) for p in info.value.problems] == [
        f"{location}:3: <line>: is not valid JSON (Expecting property name enclosed in double quotes, column 2)",
        f"{location}:4: contents: is required",  # a messages line in a Vertex file
        f"{location}:4: references: is required by this job's reward",
        f"{location}:5: contents[0].parts: must be a non-empty list of {{text}} parts",
        f"{location}:5: references: is required by this job's reward",
    ]


def test_a_file_over_its_limit_is_refused(tmp_path):
    location = write(tmp_path / "v.jsonl", [{**LINE, "id": f"x{i}"} for i in range(6)])
    assert len(load_dataset(location, limit=6)) == 6
    with pytest.raises(DatasetError, match="holds 6 examples; this job takes at most 5"):
        load_dataset(location, limit=5)


@pytest.mark.parametrize(
    "row",
    [
        {"id": "a", "messages": [{"role": "user", "content": "What is 1+1?"}], "reference_answer": "2", "task": "add"},
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "2+2?"},
            ],
            "reference_answer": {"answer": "4", "steps": 1},
        },
    ],
)
def test_to_vertex_record_round_trips_to_the_same_messages(tmp_path, row):
    from openrft.data.validation import parse_record

    original, _ = parse_record(row, 1, True)
    converted, problems = parse_vertex_record(to_vertex_record(row), 1, True)
    assert problems == [] and converted.messages == original.messages and converted.id == original.id
    assert converted.fields["references"] == (
        {"ground_truth_answer": "2"} if row.get("id") else {"answer": "4", "steps": "1"}
    )


def test_the_proto_field_name_system_instruction_is_read_as_systeminstruction():
    line = {
        "system_instruction": {"parts": [{"text": "Be brief."}]},
        "contents": [{"role": "user", "parts": [{"text": "2+3?"}]}],
        "references": {"answer": "5"},
    }
    example, problems = parse_vertex_record(line, 1, True)
    assert problems == [] and example.messages[0] == {"role": "system", "content": "Be brief."}
    assert "system_instruction" not in example.fields
