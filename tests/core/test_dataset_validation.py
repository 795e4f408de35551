"""Dataset loading: every bad line reported at once with file, line, field and problem."""

import json

import pytest

from openrft.data import DatasetError, EpochSampler, load_dataset, split_validation


def _write(tmp_path, lines):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = json.dumps({"messages": [{"role": "user", "content": "1+1?"}], "reference_answer": "2"})


def test_good_lines_load_with_metadata(tmp_path):
    line = json.dumps(
        {
            "id": "a",
            "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "reference_answer": {"solution": "x"},
            "task_id": "t1",
        }
    )
    examples = load_dataset(str(_write(tmp_path, [line, GOOD])), require_reference=True)
    assert [e.id for e in examples] == ["a", "line-2"]
    assert examples[0].messages[0]["role"] == "system"  # developer is treated as system
    assert examples[0].fields["task_id"] == "t1"
    assert examples[0].reference_answer == {"solution": "x"}


def test_all_bad_lines_reported_together(tmp_path):
    lines = [
        GOOD,
        json.dumps({"reference_answer": "2"}),  # line 2: no messages
        "{not json",  # line 3
        json.dumps({"messages": [{"role": "wizard", "content": "x"}], "reference_answer": "1"}),  # line 4
        json.dumps(
            {
                "messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "late"}],
                "reference_answer": "1",
            }
        ),  # line 5
        json.dumps({"messages": [{"role": "system", "content": "only system"}], "reference_answer": "1"}),  # 6
        json.dumps({"messages": [{"role": "user", "content": "x"}], "reference_answer": ""}),  # line 7
        json.dumps(
            {
                "messages": [{"role": "user", "content": "x"}],
                "reference_answer": "1",
                "tools": [
                    {"type": "function", "function": {"name": "f"}},
                    {"type": "function", "function": {"name": "f"}},
                ],
            }
        ),  # line 8
    ]
    path = _write(tmp_path, lines)
    with pytest.raises(DatasetError) as info:
        load_dataset(str(path), require_reference=True)
    found = {(p.line, p.field) for p in info.value.problems}
    assert found == {
        (2, "messages"),
        (3, "<line>"),
        (4, "messages[0].role"),
        (5, "messages"),
        (6, "messages"),
        (7, "reference_answer"),
        (8, "tools[1].function.name"),
    }
    text = str(info.value)
    assert f"{path}:2: messages: is required" in text
    assert f"{path}:3: <line>: is not valid JSON" in text
    assert "'wizard' is not one of system, user, assistant, tool, developer" in text


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.jsonl.*does not exist"):
        load_dataset(str(tmp_path / "nope.jsonl"))


def test_reference_required_only_when_asked(tmp_path):
    path = _write(tmp_path, [json.dumps({"messages": [{"role": "user", "content": "x"}]})])
    assert len(load_dataset(str(path), require_reference=False)) == 1
    with pytest.raises(DatasetError, match="reference_answer: is required"):
        load_dataset(str(path), require_reference=True)


def test_duplicate_ids_rejected(tmp_path):
    line = json.dumps({"id": "same", "messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(DatasetError, match="'same' repeats line 1"):
        load_dataset(str(_write(tmp_path, [line, line])))


def test_validation_split_sizes_and_determinism(tmp_path):
    lines = [json.dumps({"messages": [{"role": "user", "content": str(i)}]}) for i in range(400)]
    examples = load_dataset(str(_write(tmp_path, lines)))
    train, val = split_validation(examples, 0.25, 50, seed=3)
    assert (len(train), len(val)) == (300, 100)
    _, val2 = split_validation(examples, 0.25, 50, seed=3)
    assert [e.id for e in val] == [e.id for e in val2]
    _, small_val = split_validation(examples[:120], 0.25, 50, seed=3)
    assert len(small_val) == 50  # max(25% of 120, 50)


def test_sampler_covers_each_epoch_and_resumes_exactly():
    sampler = EpochSampler(10, 4, shuffle=True, seed=7)
    first_epoch = sampler.next_batch() + sampler.next_batch() + sampler.next_batch()[:2]
    assert sorted(first_epoch) == list(range(10))
    sampler = EpochSampler(10, 4, shuffle=True, seed=7)
    for _ in range(4):
        sampler.next_batch()
    state = sampler.state_dict()
    expected = [sampler.next_batch() for _ in range(5)]
    restored = EpochSampler(10, 4, shuffle=True, seed=7)
    restored.load_state_dict(state)
    assert [restored.next_batch() for _ in range(5)] == expected
    assert EpochSampler(5, 5, shuffle=False, seed=0).next_batch() == [0, 1, 2, 3, 4]
