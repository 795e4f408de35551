"""An unexpected error becomes a 500 answer (507 for a full disk) and the connection stays usable.

Starlette's own last-resort handler sends the 500 and then re-raises, and the server closes the
keep-alive connection: a client's next request on it got a reset. This middleware answers the 500
itself and logs the traceback, so the connection carries on.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openrft.service.errors import error_response, unexpected_error

log = logging.getLogger("openrft.service")


class InternalErrors:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # part of an answer went out already: only closing the connection ends it cleanly
                log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
                raise
            response = error_response(scope["path"], unexpected_error(exc, scope.get("method"), scope.get("path")))
            await response(scope, receive, send)
