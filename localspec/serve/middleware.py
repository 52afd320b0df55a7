"""The ASGI layers around the app: a loopback server's ``Host`` check, and a bug answered as a 500 JSON."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from localspec.serve.schemas import APIError

log = logging.getLogger("localspec.serve.app")  # the server's one logger name, as before its modules split


class LoopbackHosts:
    """On a loopback server, a request whose ``Host`` is not a loopback name gets OpenAI's error JSON (400)
    naming the header and what to do: a web page that reached the server through DNS rebinding sends its
    own site's name there. Starlette's ``TrustedHostMiddleware`` answered a bare text "Invalid host
    header", which told a user behind a proxy that rewrites ``Host`` neither why nor what next."""

    def __init__(self, app: Callable, names: set[str]) -> None:
        self.app, self.names = app, names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # (no websocket routes here)
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        if host.startswith("["):  # [::1]:8080
            name = host[: host.index("]") + 1] if "]" in host else host
        else:
            name = host.split(":", 1)[0]
        if name.lower() in self.names:
            await self.app(scope, receive, send)
            return
        error = APIError(
            400,
            f"the Host header {host[:100]!r} is not a name of this server: on a loopback address it answers "
            "only to localhost, 127.0.0.1 and [::1] (so a web page cannot reach it through DNS rebinding); "
            "send one of those (a reverse proxy: set the Host it forwards), or serve on another --host with "
            "--api-key",
            code="bad_host",
        )
        await error.response()(scope, receive, send)


class InternalErrors:
    """A bug answers OpenAI's error JSON with status 500 and the exception's type (the traceback goes to the
    log), and the connection stays usable: Starlette's own last-resort handler re-raises after answering,
    so uvicorn dropped the client's keep-alive connection and its next request failed with a reset."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # part of the answer is out: nothing sensible can follow it
                raise
            log.exception("request failed", exc_info=exc)
            error = APIError(
                500, f"internal error ({type(exc).__name__}); see the server's log", type="server_error"
            )
            await error.response()(scope, receive, send)
