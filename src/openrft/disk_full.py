"""A full disk, wherever it shows up: an ``OSError`` (ENOSPC, EDQUOT), SQLite's "database or disk is full",
PostgreSQL's ``DiskFull`` (SQLSTATE 53100). The service answers them 507 and a job fails with a message
that says the disk is full; lines are appended whole or not at all (``append_line``), and a line torn by a
crash is trimmed when the file is read again (``trim_torn_tail``)."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

DISK_FULL_MESSAGE = "the server's disk is full"


def is_disk_full(exc: BaseException) -> bool:
    """True for any error, or an error it wraps (SQLAlchemy's ``orig``, a cause), that is a full disk."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if getattr(current, "sqlstate", None) == "53100" or getattr(current, "pgcode", None) == "53100":
            return True
        text = str(current).lower()
        if "database or disk is full" in text or "no space left on device" in text:
            return True
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False


def append_line(path: Path, line: str) -> None:
    """Append ``line`` (a newline added) in one write; if the write fails part-way (a full disk), the file
    is cut back to its size before, so no reader ever sees half a line."""
    append_lines(path, [line])


def append_lines(path: Path, lines: list[str]) -> None:
    """``append_line`` for several lines: all of them or none."""
    data = "".join(line.rstrip("\n") + "\n" for line in lines).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        before = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):  # else the next reader trims the torn tail (trim_torn_tail)
                os.ftruncate(fd, before)
            raise
    finally:
        os.close(fd)


def trim_torn_tail(path: Path) -> bool:
    """Cut a last line without its newline (a write torn by a crash); True when something was cut."""
    if not path.exists():
        return False
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return False
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return False
        step = min(size, 1 << 16)
        position = size
        while position > 0:
            start = max(0, position - step)
            f.seek(start)
            chunk = f.read(position - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                f.truncate(start + newline + 1)
                return True
            position = start
        f.truncate(0)
        return True
