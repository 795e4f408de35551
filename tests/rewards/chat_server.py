"""A small OpenAI-compatible chat server on 127.0.0.1 that runs the demo model with transformers
(greedy decoding), for testing LLM judges against a real HTTP endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from openrft.models import load_causal_lm, load_tokenizer


class DemoChatModel:
    def __init__(self, name: str = "openrft-demo"):
        self.tokenizer = load_tokenizer(name)
        self.model = load_causal_lm(name, torch.device("cpu"), torch.float32).eval()
        self.lock = threading.Lock()

    @torch.no_grad()
    def reply(self, messages: list[dict], max_tokens: int) -> str:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([self.tokenizer(text, add_special_tokens=False)["input_ids"]])
        with self.lock:
            out = self.model.generate(
                ids,
                max_new_tokens=min(max_tokens, 16),
                do_sample=False,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


class ChatServer:
    def __init__(self, model: DemoChatModel):
        self.model = model
        self.requests: list[dict] = []
        self.refuse_response_format = False  # answer HTTP 400 to structured-output requests, as some servers do
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(
                    {"path": self.path, "body": body, "authorization": self.headers.get("Authorization")}
                )
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": "not found"})
                    return
                if outer.refuse_response_format and "response_format" in body:
                    self._send(400, {"error": {"message": "response_format is not supported", "type": "invalid"}})
                    return
                content = outer.model.reply(body["messages"], body.get("max_tokens", 16))
                self._send(
                    200,
                    {
                        "id": "chatcmpl-test",
                        "object": "chat.completion",
                        "model": body.get("model"),
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                        ],
                    },
                )

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
