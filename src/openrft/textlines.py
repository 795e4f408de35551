"""The lines of a JSONL file as editors and export tools write them: compressed or not, in any Unicode
encoding with or without a byte-order mark, with LF, CRLF or CR line endings.

What cannot be read as text is refused with the line and the cause (``LinesUnreadable``), never a
decoding traceback: invalid UTF-8, a NUL byte, an archive or a compression Python cannot open. Blank and
whitespace-only lines are kept here (as empty strings) so that line numbers stay those an editor shows;
readers skip them.
"""

from __future__ import annotations

import bz2
import codecs
import lzma
import re
import zlib
from collections.abc import Callable
from typing import Any

MAX_DECOMPRESSED_BYTES = 1024**3
"""A compressed dataset that expands past this is refused (a decompression bomb, or the wrong file): far
more than the services' own dataset limits (20K prompts on Bedrock, 5,000 on Vertex) take."""

BOMS = (  # longest first: the UTF-32 LE mark begins with the UTF-16 LE one
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32"),
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16"),
)
LINE_BREAK = re.compile(r"\r\n|\r|\n")
"""Only the JSONL line breaks: ``str.splitlines`` also splits at U+2028 and other characters that JSON
strings may hold unescaped."""


class LinesUnreadable(Exception):
    """The file cannot be read as lines of text: ``line`` (1-based, 0 for the whole file) and why."""

    def __init__(self, line: int, reason: str):
        super().__init__(reason)
        self.line = line
        self.reason = reason


def _decompress(data: bytes) -> bytes:
    """``data`` itself, or its decompressed content when it starts with a gzip, bzip2 or xz header."""
    if data[:2] == b"\x1f\x8b":
        kind, opener = "gzip", lambda: zlib.decompressobj(wbits=31)
    elif data[:3] == b"BZh":
        kind, opener = "bzip2", bz2.BZ2Decompressor
    elif data[:6] == b"\xfd7zXZ\x00":
        kind, opener = "xz", lzma.LZMADecompressor
    elif data[:4] == b"PK\x03\x04":
        raise LinesUnreadable(0, "is a zip archive, not a JSONL file: extract the .jsonl file from it")
    elif data[:4] == b"\x28\xb5\x2f\xfd":
        raise LinesUnreadable(0, "is zstd-compressed, which OpenRFT does not read: decompress it (zstd -d) or gzip it")
    else:
        return data
    try:
        return _bounded(opener, data, kind)
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
        raise LinesUnreadable(0, f"is {kind}-compressed but cannot be decompressed ({exc})") from None


def _bounded(opener: Callable[[], Any], data: bytes, kind: str) -> bytes:
    """Every member of a compressed stream (``cat a.gz b.gz`` is one gzip file), at most
    MAX_DECOMPRESSED_BYTES of it."""
    out = bytearray()
    while data:
        decompressor = opener()
        out += decompressor.decompress(data, MAX_DECOMPRESSED_BYTES + 1 - len(out))
        if len(out) > MAX_DECOMPRESSED_BYTES:
            limit = f"{MAX_DECOMPRESSED_BYTES / 1024**2:,.0f} MiB"
            raise LinesUnreadable(0, f"expands past {limit} when {kind}-decompressed; split the dataset")
        if not decompressor.eof:
            raise LinesUnreadable(0, f"is {kind}-compressed but ends early (a truncated file)")
        data = decompressor.unused_data.lstrip(b"\x00")  # members may be padded with NULs
    return bytes(out)


def _line_of(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in bytes) of ``offset`` in undecoded ``data``."""
    before = data[:offset]
    line = len(LINE_BREAK.findall(before.decode("latin-1"))) + 1
    start = max(before.rfind(b"\n"), before.rfind(b"\r")) + 1
    return line, offset - start + 1


def decode(data: bytes) -> str:
    """The text of a (possibly compressed) JSONL file: a byte-order mark picks the encoding, else UTF-8."""
    data = _decompress(data)
    if data.startswith(codecs.BOM_UTF8):  # UTF-8 with a mark: read below, with line numbers for bad bytes
        data = data[len(codecs.BOM_UTF8) :]
    for bom, codec, name in BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom) :].decode(codec)
            except UnicodeDecodeError as exc:
                raise LinesUnreadable(
                    0, f"starts with a {name} byte-order mark but is not {name} ({exc.reason})"
                ) from None
    if len(data) >= 4 and data[1:4:2] == b"\x00\x00" and data[0:4:2] != b"\x00\x00":
        raise LinesUnreadable(1, "looks like UTF-16 without a byte-order mark: save the file as UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _line_of(data, exc.start)
        byte = data[exc.start : exc.start + 1].hex()
        raise LinesUnreadable(
            line,
            f"is not valid UTF-8 (byte 0x{byte} at column {column}): save the file as UTF-8 "
            "(or with a UTF-16 byte-order mark)",
        ) from None


def split_lines(text: str) -> list[str]:
    """Lines split at LF, CRLF or CR only (a trailing line break adds no line); a NUL character is refused."""
    lines = LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        column = line.find("\x00")
        if column >= 0:
            raise LinesUnreadable(
                number, f"holds a NUL character at column {column + 1}: the file is binary or in another encoding"
            )
    return lines


def text_lines(data: bytes) -> list[str]:
    """The lines of a JSONL file's bytes (``decode`` then ``split_lines``), or LinesUnreadable."""
    return split_lines(decode(data))
