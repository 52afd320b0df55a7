"""The request queue and the one worker thread that runs its generations, one at a time, in arrival order.

A queued :class:`Job` carries its events (tokens, an error, the end) from the worker thread to the event
loop that answers its client. A cancelled job (the client left, the server is stopping) ends after the token
in flight: the worker closes the engine's generator, whose ``finally:`` puts the KV cache back to what was
accepted, so the next request starts from a true state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localspec.errors import LocalspecError, RpcError
from localspec.pipeline.tool_calls import NO_TOOLS, ToolUse
from localspec.serve.metrics import Metrics
from localspec.serve.schemas import APIError, from_localspec

if TYPE_CHECKING:
    from localspec.pipeline.api import Pipeline

log = logging.getLogger("localspec.serve.app")  # the server's one logger name, as before its modules split


@dataclass(frozen=True)
class TokenEvent:
    """One generated token, as the worker hands it to the request's coroutine."""

    text: str  # the token's text
    from_draft: bool  # the drafter proposed it
    finish_reason: str | None  # set on the last token
    content: str  # a chat's visible content of it (tool calls read out); the text when no tools
    tool_calls: list[dict[str, Any]] | None  # tool-call deltas it completes, if any


@dataclass(frozen=True)
class ErrorEvent:
    """The generation failed: the OpenAI error to answer with (an ``EndEvent`` follows)."""

    error: APIError


@dataclass(frozen=True)
class EndEvent:
    """The job is over (always its last event); the generation's stats, None when nothing ran."""

    stats: dict[str, Any] | None


#: What travels from the worker thread to a request's coroutine.
JobEvent = TokenEvent | ErrorEvent | EndEvent


@dataclass
class Job:
    """One queued generation and the channel its events travel on (worker thread -> event loop)."""

    tokens: list[int]
    kwargs: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    endpoint: str = "completions"  # "chat" | "completions": the label of its outcome in /metrics
    tools: ToolUse = NO_TOOLS  # a chat's: how its tokens read as content and tool calls
    events: asyncio.Queue[JobEvent] = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.perf_counter)
    queue_seconds: float = 0.0

    def emit(self, event: JobEvent) -> None:
        """Hand ``event`` to the request's coroutine (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
            self.cancel.set()


class Worker:
    """The single thread that runs queued generations one at a time, in arrival order."""

    def __init__(self, pipe: Pipeline, metrics: Metrics, *, max_queue: int) -> None:
        self.pipe = pipe
        self.metrics = metrics
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.busy = False
        #: why the model can no longer generate (an rpc-server lost mid-generation), or None
        self.lost: str | None = None

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="localspec-serve-worker", daemon=True)
            self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; raises ``queue.Full`` when the queue is full, ``APIError`` when stopping."""
        if self._stopping.is_set():
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        self._queue.put_nowait(job)

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the queue's expected drain time, 1 s at least."""
        per_job = self.metrics.snapshot()["recent_job_seconds"] or 1.0
        return int(min(3600, max(1, math.ceil(per_job * (self.waiting + 1)))))

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel the running generation after its current token, refuse what waits, end the thread.

        Safe to call more than once (Ctrl-C calls it with ``timeout=0``, the app's shutdown again to wait).
        """
        self._stopping.set()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self.metrics.count(job.endpoint, "cancelled")
                job.emit(ErrorEvent(APIError(503, "the server is shutting down", type="server_error")))
                job.emit(EndEvent(None))
        with contextlib.suppress(queue.Full):  # the queue was just emptied; a sentinel ends the thread
            self._queue.put_nowait(None)
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._thread = None

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job.queue_seconds = time.perf_counter() - job.enqueued
            if job.cancel.is_set() or self._stopping.is_set():
                self.metrics.count(job.endpoint, "cancelled")
                job.emit(EndEvent(None))
                continue
            self.busy = True
            t0 = time.perf_counter()
            try:
                self._generate(job)
            finally:
                self.busy = False
                log.debug("job done in %.3f s", time.perf_counter() - t0)

    def _generate(self, job: Job) -> None:
        stream = None
        last = None
        outcome = "cancelled"
        t0 = time.perf_counter()
        try:
            stream = self.pipe.stream_tokens(job.tokens, **job.kwargs)
            for r in job.tools.responses(stream):  # (content is the text when no tools were offered)
                last = r
                job.emit(TokenEvent(r.text, r.from_draft, r.finish_reason, r.content, r.tool_calls))
                if r.finish_reason:
                    outcome = "ok"
                    break  # the answer is complete: the client gets it before the stream is closed
                if job.cancel.is_set() or self._stopping.is_set():
                    break
        except RpcError as exc:
            outcome = "error"
            # an rpc-server lost mid-generation is the server's state, not a bad request: 503, and /health
            # says so from now on
            self.lost = self.lost or exc.message
            job.emit(ErrorEvent(from_localspec(exc, 503, code="backend_lost")))
        except LocalspecError as exc:
            outcome = "error"
            job.emit(ErrorEvent(from_localspec(exc)))
        except ValueError as exc:
            outcome = "error"
            job.emit(ErrorEvent(APIError(400, str(exc))))
        except Exception as exc:  # a bug: the client gets a 500 without a traceback, the log gets it
            outcome = "error"
            log.exception("generation failed")
            why = f"internal error ({type(exc).__name__}); see the server's log"
            job.emit(ErrorEvent(APIError(500, why, type="server_error")))
        finally:
            stats = last.stats.as_dict() if last is not None else None
            if stats is not None:
                self.metrics.finished(stats, time.perf_counter() - t0)
            self.metrics.count(job.endpoint, outcome)
            job.emit(EndEvent(stats))
            # Then the engine's finally, in this thread and before the next job: it puts the KV cache
            # right and feeds the suffix cache (a request's indexing, now and then a merge of its parts,
            # and the store's save: long with a large store), which no client waits for now. An error
            # there is logged, never the worker's end.
            if isinstance(stream, Generator):
                try:
                    stream.close()
                except Exception:
                    log.exception("closing a finished generation failed")
