"""Dataset files as editors and export tools write them: read correctly (byte-order marks, UTF-16/32,
CRLF and CR line endings, gzip/bzip2/xz, blank and trailing lines), or refused in one line that names the
file, the line and the cause (invalid UTF-8, NUL bytes, an archive, a truncated stream), never a traceback."""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import lzma
import subprocess
import sys
import zipfile
from io import BytesIO

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openrft.data.loader import DatasetError, load_dataset
from openrft.spec.dialects.common import DatasetUnreadable, count_examples

RECORDS = [
    {"id": "a", "messages": [{"role": "user", "content": "Größe? 2+3"}], "reference_answer": "5"},
    {"id": "b", "messages": [{"role": "user", "content": "line\u2028separator ✓"}], "reference_answer": 7},
    {"id": "c", "messages": [{"role": "user", "content": "日本語"}], "reference_answer": {"answer": "x"}},
]


def jsonl(newline: str = "\n", blank: str = "") -> str:
    return newline.join(json.dumps(r, ensure_ascii=False) for r in RECORDS) + newline + blank


def zipped(text: bytes) -> bytes:
    buffer = BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("train.jsonl", text)
    return buffer.getvalue()


READABLE = {
    "utf-8": jsonl().encode(),
    "utf-8 BOM": codecs.BOM_UTF8 + jsonl().encode(),
    "utf-16 BOM": jsonl().encode("utf-16"),
    "utf-16-be BOM": codecs.BOM_UTF16_BE + jsonl().encode("utf-16-be"),
    "utf-32 BOM": jsonl().encode("utf-32"),
    "CRLF": jsonl("\r\n").encode(),
    "CR": jsonl("\r").encode(),
    "blank and trailing lines": ("\n\n" + jsonl("\n", "\n  \n\t\n")).encode(),
    "no final newline": jsonl().rstrip("\n").encode(),
    "gzip": gzip.compress(jsonl().encode()),
    "two gzip members": gzip.compress(jsonl().encode()[:50]) + gzip.compress(jsonl().encode()[50:]),
    "bzip2": bz2.compress(jsonl("\r\n").encode()),
    "xz": lzma.compress(codecs.BOM_UTF8 + jsonl().encode()),
}
REFUSED = {
    "invalid UTF-8": (jsonl().encode() + b'{"id": "d", "x": "\xff"}\n', 4, "is not valid UTF-8 (byte 0xff at column"),
    "latin-1": (jsonl().encode("latin-1", "replace"), 1, "is not valid UTF-8 (byte 0xf6 at column 57)"),
    "UTF-16 without BOM": (jsonl().encode("utf-16-le"), 1, "looks like UTF-16 without a byte-order mark"),
    "NUL byte": (jsonl().encode() + b"\x00\x00\n", 4, "holds a NUL character at column 1"),
    "zip archive": (zipped(jsonl().encode()), 0, "is a zip archive, not a JSONL file"),
    "truncated gzip": (gzip.compress(jsonl().encode())[:-12], 0, "is gzip-compressed but ends early"),
    "corrupt bzip2": (b"BZh9" + b"\x00" * 40, 0, "is bzip2-compressed but cannot be decompressed"),
    "zstd": (b"\x28\xb5\x2f\xfd" + b"\x00" * 8, 0, "is zstd-compressed"),
    "bad UTF-16 after BOM": (codecs.BOM_UTF16_LE + b"{\x00\x00", 0, "starts with a UTF-16 byte-order mark"),
}


@pytest.mark.parametrize("name", READABLE)
def test_an_exported_file_is_read_as_written(tmp_path, name):
    path = tmp_path / "train.jsonl"
    path.write_bytes(READABLE[name])
    examples = load_dataset(str(path), require_reference=True)
    assert [(e.id, e.messages, e.reference_answer) for e in examples] == [
        (r["id"], r["messages"], r["reference_answer"]) for r in RECORDS
    ]
    assert count_examples(str(path)) == len(RECORDS)


@pytest.mark.parametrize("name", REFUSED)
def test_an_unreadable_file_is_one_line_naming_file_line_and_cause(tmp_path, name):
    data, line, cause = REFUSED[name]
    path = tmp_path / "train.jsonl"
    path.write_bytes(data)
    with pytest.raises(DatasetError) as info:
        load_dataset(str(path))
    [problem] = info.value.problems
    text = str(problem)
    assert "\n" not in text and cause in text
    assert text.startswith(f"{path}:{line}: " if line else f"{path}: ")
    with pytest.raises(DatasetUnreadable, match=r"save the file|zip|compressed|NUL|UTF"):
        count_examples(str(path))


LINE_ENDINGS = st.sampled_from(["\n", "\r\n", "\r"])
ENCODINGS = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32", "latin-1", "cp1252", "utf-16-le"])
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@st.composite
def exported_files(draw):
    """A file a tool might write: records with random text, in a random encoding and line ending, maybe
    compressed, maybe with random bytes spliced in."""
    records = draw(
        st.lists(
            st.fixed_dictionaries({"q": TEXT, "a": st.one_of(TEXT, st.integers(), st.booleans())}),
            min_size=1,
            max_size=4,
        )
    )
    lines = [
        json.dumps(
            {"messages": [{"role": "user", "content": r["q"] or "?"}], "reference_answer": r["a"]},
            ensure_ascii=draw(st.booleans()),
        )
        for r in records
    ]
    text = draw(LINE_ENDINGS).join(lines) + draw(st.sampled_from(["", "\n", "\r\n\r\n", "\n \n"]))
    data = text.encode(draw(ENCODINGS), errors="replace")
    noise = draw(st.binary(max_size=6))
    if noise:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + noise + data[at:]
    compress = draw(st.sampled_from([None, gzip.compress, bz2.compress, lzma.compress]))
    return compress(data) if compress else data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(exported_files(), st.binary(max_size=64)))
def test_any_bytes_are_read_or_refused_in_one_clear_line(tmp_path, data):
    path = tmp_path / "train.jsonl"
    path.write_bytes(data)
    try:
        examples = load_dataset(str(path))
    except DatasetError as exc:
        for problem in exc.problems:
            text = str(problem)
            assert text.startswith(f"{path}:") and "\n" not in text and "Traceback" not in text
            assert problem.line >= 0 and problem.message
        return
    assert all(e.messages and e.messages[0]["role"] == "user" for e in examples)
    assert count_examples(str(path)) == len(examples)


def test_spec_validate_refuses_a_bad_file_in_one_line_without_a_traceback(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_bytes(codecs.BOM_UTF8 + jsonl("\r\n").encode() + b'{"messages": "\xc3\x28"}\r\n')
    job = tmp_path / "job.yaml"
    job.write_text(
        f"run: {{model_name_or_path: openrft-demo, data_s3_path: {data}}}\n"
        "training_config:\n  rollout: {rewards: {preset_reward_function: exact_match}}\n  trainer: {max_steps: 1}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "openrft", "spec", "validate", str(job)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"error: {job} is not a valid job: {data}:4: <line>: is not valid UTF-8 (byte 0xc3 at column 15): save the "
        "file as UTF-8 (or with a UTF-16 byte-order mark)"
    )


def test_a_compressed_file_that_expands_past_the_cap_is_refused(tmp_path, monkeypatch):
    from openrft import textlines

    monkeypatch.setattr(textlines, "MAX_DECOMPRESSED_BYTES", 1024**2)  # 1 MiB instead of 1 GiB
    path = tmp_path / "train.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl().encode() * 20_000))  # about 4 MiB of lines, 30 KiB on disk
    with pytest.raises(DatasetError) as info:
        load_dataset(str(path))
    assert str(info.value.problems[0]) == f"{path}: expands past 1 MiB when gzip-decompressed; split the dataset"
