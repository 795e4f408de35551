"""Running several commands at once: a test that builds the same thing twice waits for the slower build only."""

from __future__ import annotations

import subprocess


def run_at_once(commands: list[list[str]], timeout: float) -> None:
    """Start every command, then wait for each; raise with the failed command's output if any exits non-zero."""
    processes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for c in commands]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    for command, process, output in zip(commands, processes, outputs):
        if process.returncode:
            raise AssertionError(f"{command} exited with {process.returncode}:\n{output.decode(errors='replace')}")
