"""``openrft train`` shows the run's events on stderr: warnings always, the rest unless ``--quiet``."""

from __future__ import annotations

from openrft.cli import main
from openrft.cli.train import event_printer


def test_the_runs_events_are_on_stderr_and_quiet_keeps_only_warnings(recipe_factory, tmp_path, capsys):
    recipe = recipe_factory(max_steps=1, save_steps=1)
    assert main(["train", str(recipe), "--output", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert f"info: checkpoint saved at step 1: {tmp_path / 'run'}" in err

    quiet = event_printer(quiet=True)
    quiet("info", "checkpoint saved")
    quiet("warn", "learner process learner-1 ended")
    assert capsys.readouterr().err == "warn: learner process learner-1 ended\n"
