"""A Tinker save killed mid-write leaves no temporary directory once the server starts again (issue 49, point 7)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from openrft.service.store import Store
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


def test_a_save_on_a_full_disk_says_so_keeps_nothing_and_works_once_there_is_space(tmp_path):
    tinker = pytest.importorskip("tinker")
    import numpy as np
    from tinker import types

    from tests.service.svc_helpers import Service
    from tests.service.test_disk_full import fill, small_disk
    from tests.tinker_api.test_sdk import MODEL, datum

    os.environ["TINKER_TELEMETRY"] = "0"
    with small_disk(tmp_path / "disk", "64m") as disk:
        service = Service(disk / "data", f"sqlite:///{tmp_path / 'openrft.db'}", env={"HF_HUB_OFFLINE": "1"})
        store = Store.open(service.database_url)
        key = store.create_key("a")[1]
        store.close()
        try:
            service.wait_healthy(service.serve(workers=0, wait=False), timeout=400)
            client = tinker.ServiceClient(base_url=service.base_url, api_key="tml-" + key)
            tc = client.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()
            tokens = tc.get_tokenizer().encode("What is 12+30? 42")
            tc.forward_backward(
                [datum(tokens, target_tokens=tokens[1:], weights=np.ones(len(tokens) - 1))], "cross_entropy"
            ).result()
            tc.optim_step(types.AdamParams(learning_rate=0.02)).result()
            filler = fill(disk)
            with pytest.raises(Exception, match="disk is full") as raised:
                tc.save_state("full").result()
            assert "err_" not in str(raised.value) and str(disk) not in str(raised.value)
            saved = [p for p in (disk / "data" / "tinker").rglob("*") if "full" in p.name]
            assert saved == [], saved  # nothing half-written, no temporary directory
            filler.unlink()
            assert tc.save_state("full").result().path.endswith("/weights/full")
        finally:
            service.stop_all()
