"""A Tinker save killed mid-write leaves no temporary directory once the server starts again (issue 49, point 7)."""

from __future__ import annotations

import signal
import subprocess
import sys

from openrft.service.tinker.checkpoints import CheckpointStore, Location

SAVE_THEN_HANG = """
import sys, time, torch
from pathlib import Path
from openrft.service.tinker.checkpoints import CheckpointStore, Location

def slow_save(obj, path):
    Path(path).write_bytes(b"x" * (1 << 20))  # part of the state written...
    print("writing", flush=True)
    time.sleep(60)  # ... and the process killed before the rest

torch.save = slow_save
CheckpointStore(Path(sys.argv[1])).save(Location("s:train:0", "weights", "final"), "alice", {}, {})
"""


def test_a_save_killed_mid_write_is_swept_at_the_next_start_and_a_live_one_is_not(tmp_path):
    root = tmp_path / "tinker"
    killed = subprocess.Popen([sys.executable, "-c", SAVE_THEN_HANG, str(root)], stdout=subprocess.PIPE, text=True)
    live = subprocess.Popen([sys.executable, "-c", SAVE_THEN_HANG, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        for process in (killed, live):
            assert process.stdout.readline().strip() == "writing"
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        folder = root / "s:train:0" / "weights"
        assert len([p for p in folder.iterdir() if p.name.startswith(".final.tmp-")]) == 2

        store = CheckpointStore(root)  # what the server does when it starts

        left = [p.name for p in folder.iterdir()]
        assert left == [f for f in left if f.startswith(f".final.tmp-{live.pid}-")] and len(left) == 1, left
        assert store.list("s:train:0", "alice") == []  # never a checkpoint
    finally:
        for process in (killed, live):
            process.kill()
            process.wait(30)
    CheckpointStore(root)  # the second one too, once its process is gone
    assert list(folder.iterdir()) == []
    assert Location("s:train:0", "weights", "final").tinker_path == "tinker://s:train:0/weights/final"
