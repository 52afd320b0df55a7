"""``localspec serve``: an OpenAI-compatible HTTP endpoint over one loaded
:class:`~localspec.pipeline.api.Pipeline`.

Serving model: one pair, one generation at a time. Requests are validated and tokenized as they arrive
(bad input is refused at once, without waiting), then queued in arrival order (FIFO) for a single worker
thread that runs them one by one; a full queue answers 429 with ``Retry-After``. A client that goes away
(closes the stream, drops the connection) has its generation cancelled after the token in flight: the
worker closes the engine's generator, whose ``finally:`` puts the KV cache back to what was accepted, so
the next request starts from a true state and gets the same text a fresh pipeline would.

The web stack is the one Gradio already installs: FastAPI/Starlette for routing and responses, pydantic
for request validation, uvicorn as the server. Errors are OpenAI-style JSON
(``{"error": {"message", "type", "param", "code"}}``) with the matching status, never a traceback.
Who may connect follows :func:`localspec.serve.exposure.check_exposure`, the rule every localspec server uses.

This module binds the address and runs the server (:func:`serve` in the foreground, :func:`start_background`
from a thread); the other modules of :mod:`localspec.serve` hold the rest.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from localspec.serve.endpoint import Endpoint
from localspec.serve.options import (
    ServeError,
    ServeOptions,
    exposure_line,
)
from localspec.serve.routes import create_app
from localspec.serve.worker import Worker

if TYPE_CHECKING:
    from localspec.pipeline.api import Pipeline


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free one), or a ServeError naming the fix."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServeError(
            f"cannot resolve the address {host!r}: {exc}", hint="use an IP such as 127.0.0.1"
        ) from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ServeError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="another program may use that port: pick another with --port (or stop the other server)",
        ) from None
    sock.set_inheritable(True)
    return sock


class _Uvicorn:
    """uvicorn's Server, plus: on Ctrl-C the running generation is cancelled at once (not after its
    last token) and queued requests are told the server is stopping, so shutdown takes one round."""

    def __init__(self, app: FastAPI, *, log_level: str = "warning", access_log: bool = False) -> None:
        import uvicorn

        worker: Worker = app.state.worker

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:
                worker.stop(timeout=0)
                if self.should_exit:
                    # Stopping already, within timeout_graceful_shutdown. uvicorn would force the exit on a
                    # second Ctrl-C, cancelling the app's lifespan mid-wait: its traceback, nothing faster.
                    return
                super().handle_exit(sig, frame)

        config = uvicorn.Config(
            app,
            log_level=log_level,
            access_log=access_log,
            timeout_graceful_shutdown=5,
            lifespan="on",
        )
        self.server = Server(config)


@dataclass
class BackgroundServer:
    """A server running in a thread of this process (tests, the UI): ``url`` ends in ``/v1``."""

    url: str
    app: FastAPI
    _server: Any
    _thread: threading.Thread

    @property
    def base(self) -> str:
        return self.url.removesuffix("/v1")

    def stop(self) -> None:
        self.app.state.worker.stop(timeout=0)  # cancel what runs, refuse what waits (as Ctrl-C does)
        self._server.should_exit = True
        self._thread.join(30)


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host in ("::", "::1") else host)
    return f"http://{shown}:{port}/v1"


def start_background(pipe: Pipeline, opts: ServeOptions | None = None) -> BackgroundServer:
    """Serve ``pipe`` from a thread (port 0 picks a free one); returns once it accepts connections."""
    opts = opts or ServeOptions(port=0)
    exposure_line(opts)
    sock = bind(opts.host, opts.port)
    port = sock.getsockname()[1]
    app = create_app(pipe, opts)
    uv = _Uvicorn(app)
    thread = threading.Thread(
        target=uv.server.run, kwargs={"sockets": [sock]}, daemon=True, name="localspec-serve"
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise ServeError("the HTTP server did not start", hint="run with LOCALSPEC_VERBOSE=1 to see why")
        time.sleep(0.01)
    return BackgroundServer(_url(opts.host, port), app, uv.server, thread)


@contextlib.contextmanager
def _signals_stop_once() -> Generator[None, None, None]:
    """Ctrl-C and SIGTERM stop :func:`serve` once, with no traceback and a clean exit. uvicorn handles both
    while it runs and then, after its graceful shutdown, raises each signal it caught again under the
    handlers it found (uvicorn 0.55, ``Server.capture_signals``): under Python's own, SIGTERM killed the
    process (exit status -15, no "stopped" line) and a second Ctrl-C became a KeyboardInterrupt in the
    middle of the shutdown (uvicorn's traceback, or death by SIGINT). While ``serve`` runs, the handlers
    uvicorn finds do nothing: it has stopped the server already."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve(
    pipe: Pipeline, opts: ServeOptions, *, echo: Callable[[str], None] = print, log_requests: bool = False
) -> None:
    """Serve ``pipe`` until Ctrl-C (or SIGTERM). Prints the address, the model id and the exposure line."""
    line = exposure_line(opts)
    sock = bind(opts.host, opts.port)
    port = sock.getsockname()[1]
    app = create_app(pipe, opts)
    ep: Endpoint = app.state.endpoint
    names = ep.model_id + (f" (also: {', '.join(ep.names[1:])})" if len(ep.names) > 1 else "")
    echo(f"localspec serve: OpenAI-compatible API at {_url(opts.host, port)}  model {names}")
    echo(f"  pair: {pipe.info.note}; context {pipe.n_ctx} tokens{pipe.n_ctx_note()}")
    at_once = "one request at a time" if pipe.parallel == 1 else f"{pipe.parallel} requests at once"
    echo(f"  {at_once} ({pipe.parallel_reason}), up to {opts.max_queue} waiting")
    echo(f"  {line}")
    echo("  Ctrl+C to stop")
    uv = _Uvicorn(app, log_level="info" if log_requests else "warning", access_log=log_requests)
    try:
        with _signals_stop_once():
            uv.server.run(sockets=[sock])
    except KeyboardInterrupt:  # a Ctrl-C before uvicorn took over the signals
        pass
    finally:
        sock.close()
