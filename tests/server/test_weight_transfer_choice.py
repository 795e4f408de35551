"""How full weights reach a server, chosen by what it answers (``rollout/weight_transfer.py``): a real HTTP server
on 127.0.0.1 that has vLLM's ``/collective_rpc`` and ``/reset_prefix_cache`` but not its weight-transfer routes
gets the files, and the choice is logged with its reason (tests/vllm: the real vLLM server, which has the routes)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import torch

from openrft.rollout.remote import RemoteGenerator
from openrft.rollout.weight_files import weight_files
from openrft.spec.job import LoraSpec


class RpcOnly(BaseHTTPRequestHandler):
    """vLLM's development-mode RPC routes only: what an older vLLM, or one without the RL routes, serves."""

    calls: ClassVar[list[tuple[str, str, dict | None]]] = []

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.calls.append(("GET", self.path, None))
        self._answer(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        self.calls.append(("POST", self.path, body))
        known = self.path in ("/collective_rpc", "/reset_prefix_cache")
        self._answer(200 if known else 404, {"results": [None]} if known else {"detail": "Not Found"})

    def log_message(self, *args) -> None:
        return None


def test_a_server_without_the_routes_gets_files_and_the_choice_is_logged(tmp_path: Path, caplog) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RpcOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{server.server_address[1]}"
    generator = RemoteGenerator(
        root,
        adapter_dir=tmp_path / "weights",
        lora=LoraSpec(enabled=False),
        base_model="openrft-demo",
        eos_token_ids=[0],
        adapter_prefix="full",
    )
    weights = {"model.layers.0.mlp.up_proj.weight": torch.ones(4, 4), "lm_head.weight": torch.zeros(8, 4)}
    try:
        with caplog.at_level(logging.INFO, logger="openrft.rollout"):
            generator.load_adapter(weights, 1)
            generator.load_adapter(weights, 2)
    finally:
        server.shutdown()
        generator.close()
    assert generator.full_weights_path == "files"
    assert generator.full_weights_reason == "the server has no weight-transfer routes (GET /weight_info answered 404)"
    chosen = [r.getMessage() for r in caplog.records if "full weights reach" in r.getMessage()]
    assert chosen == [
        f"full weights reach {root} by safetensors files + reload_weights (collective_rpc): "
        f"{generator.full_weights_reason}"
    ]  # once per server, not per update
    rpc = [body for method, path, body in RpcOnly.calls if path == "/collective_rpc"]
    assert [b["method"] for b in rpc] == ["reload_weights", "reload_weights"]
    assert weight_files(Path(rpc[-1]["kwargs"]["weights_path"]))  # the files the server was told to read
    assert [path for method, path, _ in RpcOnly.calls if method == "GET"] == ["/weight_info"]
