"""Request size limits: a small limit for JSON bodies, a larger one for file uploads.

A declared Content-Length over the limit is refused before any byte is read; a chunked body is
counted as it arrives and refused the moment it passes the limit.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UPLOAD_PATHS = ("/v1/files",)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_request_bytes: int, max_upload_bytes: int):
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.max_upload_bytes = max_upload_bytes

    def limit_for(self, path: str) -> int:
        return self.max_upload_bytes if path.rstrip("/") in UPLOAD_PATHS else self.max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _too_large(send, limit, scope["path"])
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, f"request body is larger than the limit of {limit} bytes")
            return message

        await self.app(scope, counted, send)


async def _too_large(send: Send, limit: int, path: str) -> None:
    import json

    message = f"request body is larger than the limit of {limit} bytes"
    if path.startswith("/api/v1/"):  # the Tinker API's error shape (service/tinker)
        body = json.dumps({"detail": message})
    else:
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": "request_too_large"}
        body = json.dumps({"error": error})
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body.encode()})
