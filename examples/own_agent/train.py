"""``make own-agent``: the agent's entrypoint (serve.py) in its own process, then ``openrft train recipe.yaml``.

The summary ``openrft train`` prints at the end has the validation reward before and after training.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
PORT = 8765  # recipe.yaml's openrft.agent.url


def wait_for_agent(process: subprocess.Popen, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the agent's entrypoint exited ({process.returncode}); is port {PORT} free?")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/", timeout=1)
        except urllib.error.HTTPError:
            return  # it answers (GET is not its method)
        except OSError:
            time.sleep(0.2)
            continue
        return
    sys.exit(f"the agent's entrypoint did not answer on port {PORT}")


def main() -> int:
    agent = subprocess.Popen([sys.executable, "serve.py", "--port", str(PORT)], cwd=HERE)
    try:
        wait_for_agent(agent)
        openrft = Path(sys.executable).with_name("openrft")
        command = [str(openrft), "train", str(HERE / "recipe.yaml"), "--output", "runs/own-agent", "--overwrite"]
        return subprocess.call(command + sys.argv[1:])
    finally:
        agent.terminate()
        agent.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
