"""Room kept beside an SQLite database for recording what a full disk did.

When the disk under an SQLite store fills, every write fails, the one that would record a job's failure too:
the job would stay ``running`` while its worker retried. A few MiB are kept in a reserve file next to the
database; a write that fails on a full disk frees it and is tried once more (``Store.with_room``), so the
outcome is recorded. The reserve is laid again once the disk has room for it several times over.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

RESERVE_BYTES = 4 << 20
ROOM_FACTOR = 4  # the reserve is laid again only when the disk has this many times its size free

log = logging.getLogger("openrft.store")


class SpaceReserve:
    def __init__(self, path: Path, size: int = RESERVE_BYTES):
        self.path = path
        self.size = size

    def ensure(self) -> bool:
        """Lay the reserve if it is missing and the disk has room; whether it is in place."""
        if self.path.exists():
            return True
        try:
            if shutil.disk_usage(self.path.parent).free < ROOM_FACTOR * self.size:
                return False
            partial = self.path.with_name(self.path.name + ".partial")
            with partial.open("wb") as out:
                out.write(b"\0" * self.size)  # written, not sparse: the blocks are really taken
                out.flush()
                os.fsync(out.fileno())
            partial.replace(self.path)
            return True
        except OSError:
            with contextlib.suppress(OSError):
                self.path.with_name(self.path.name + ".partial").unlink()
            return False

    def release(self) -> bool:
        """Free the reserve; whether there was one to free."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        log.warning("the disk under the database is full: its reserve of %d MiB was freed", self.size >> 20)
        return True
