"""The request queue and the one worker thread that runs its generations: up to ``parallel`` at once in one
batch (a target pass per step over all of them), the others waiting in arrival order.

A queued :class:`Job` carries its events (tokens, an error, the end) from the worker thread to the event
loop that answers its client. A cancelled job (the client left, the server is stopping) ends after the step
in flight: the batch ends its generation, which puts its sequence back to what was accepted, so the next
request on it starts from a true state, and nobody else's tokens change. A request that fails (a grammar
that breaks, a context overflow) fails alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localspec.decoding.batch import Batch, StepEvent
from localspec.decoding.engine import Generation, TokenResponse
from localspec.decoding.stats import GenerationStats
from localspec.errors import LocalspecError, RpcError
from localspec.llama.prompt_cache import PromptCache
from localspec.pipeline.tool_calls import NO_TOOLS, ChatResponse, ToolUse
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
    """The one thread that runs the queued generations: up to the pipeline's ``parallel`` at once, one target
    pass per step over all of them (:class:`localspec.decoding.batch.Batch`), the rest waiting in arrival
    order."""

    def __init__(self, pipe: Pipeline, metrics: Metrics, *, max_queue: int) -> None:
        self.pipe = pipe
        self.metrics = metrics
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        #: the jobs generating now (their prompts going in, or their tokens coming)
        self.live: dict[int, _Live] = {}
        #: sequences that generate at once
        self.slots = max(1, pipe.parallel)
        #: why the model can no longer generate (an rpc-server lost mid-generation), or None
        self.lost: str | None = None

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    @property
    def busy(self) -> bool:
        """Whether some generation runs now."""
        return bool(self.live)

    def slot_stats(self) -> list[GenerationStats]:
        """The running generations' stats as they stand (acceptance, draft lengths cut to fit the pass)."""
        return [live.gen.stats for live in list(self.live.values())]

    def prompt_caches(self) -> dict[str, PromptCache]:
        """The models' prompt caches by role ("target", "draft"): what earlier prompts left in host memory."""
        models = {"target": self.pipe.target, "draft": self.pipe.draft}
        return {k: m.prompt_cache for k, m in models.items() if m is not None and m.prompt_cache is not None}

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
        return int(min(3600, max(1, math.ceil(per_job * (self.waiting + 1) / self.slots))))

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel the running generations after their current step, refuse what waits, end the thread.

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
        # a failure while a finished generation feeds the suffix cache (a store's save) is logged, never the
        # worker's end
        batch = self.pipe.batch(
            on_cleanup_error=lambda gen, exc: log.error("closing a finished generation failed", exc_info=exc)
        )
        try:
            while self._admit(batch):
                batch.step(self._deliver)
                self._drop_cancelled(batch)
        finally:
            for live in list(self.live.values()):
                batch.cancel(live.gen)
                self._close(live, "cancelled")

    def _admit(self, batch: Batch) -> bool:
        """Start the queued jobs that fit (waiting for one when nothing runs); False at the stop sentinel."""
        while len(self.live) < self.slots:
            try:
                job = self._queue.get(block=not self.live)
            except queue.Empty:
                return True
            if job is None:
                return False
            job.queue_seconds = time.perf_counter() - job.enqueued
            if job.cancel.is_set() or self._stopping.is_set():
                self.metrics.count(job.endpoint, "cancelled")
                job.emit(EndEvent(None))
                continue
            try:
                gen = self.pipe.start_tokens(job.tokens, **job.kwargs)
            except Exception as exc:  # a request the pipeline refuses fails alone
                self._fail(job, exc)
                self.metrics.count(job.endpoint, "error")
                job.emit(EndEvent(None))
                continue
            live = _Live(job, gen, _Feed())
            live.responses = job.tools.responses(
                live.feed
            )  # (content is the text when no tools were offered)
            self.live[id(gen)] = live
            batch.add(gen)
        return True

    def _deliver(self, event: StepEvent) -> None:
        """Hand a step's tokens (or its error) to the job's client; a finished job gets its end now, before
        its generation's ending feeds the suffix cache."""
        live = self.live.get(id(event.gen))
        if live is None:
            return
        for r in event.tokens:
            live.feed.items.append(r)
            out = next(live.responses)
            live.last = r
            live.job.emit(
                TokenEvent(out.text, out.from_draft, out.finish_reason, out.content, out.tool_calls)
            )
        if event.error is not None:
            self._fail(live.job, event.error)
            self._close(live, "error")
        elif event.done:
            self._close(live, "ok" if event.gen.finish in ("stop", "length") else "cancelled")

    def _drop_cancelled(self, batch: Batch) -> None:
        """End the jobs whose client left (or all, when stopping): their sequences are free next step."""
        for live in list(self.live.values()):
            if live.job.cancel.is_set() or self._stopping.is_set():
                batch.cancel(live.gen)
                self._close(live, "cancelled")

    def _close(self, live: _Live, outcome: str) -> None:
        self.live.pop(id(live.gen), None)
        stats = live.gen.stats.as_dict() if live.last is not None else None
        if stats is not None:
            self.metrics.finished(stats, time.perf_counter() - live.t0)
        self.metrics.count(live.job.endpoint, outcome)
        live.job.emit(EndEvent(stats))

    def _fail(self, job: Job, exc: BaseException) -> None:
        """Tell the client why its generation failed (never a traceback)."""
        if isinstance(exc, RpcError):
            # an rpc-server lost mid-generation is the server's state, not a bad request: 503, and /health
            # says so from now on
            self.lost = self.lost or exc.message
            job.emit(ErrorEvent(from_localspec(exc, 503, code="backend_lost")))
        elif isinstance(exc, LocalspecError):
            job.emit(ErrorEvent(from_localspec(exc)))
        elif isinstance(exc, ValueError):
            job.emit(ErrorEvent(APIError(400, str(exc))))
        else:  # a bug: the client gets a 500 without a traceback, the log gets it
            log.error("generation failed", exc_info=exc)
            why = f"internal error ({type(exc).__name__}); see the server's log"
            job.emit(ErrorEvent(APIError(500, why, type="server_error")))


class _Feed:
    """The tokens a job's tool-call reader has still to read (it reads one per token handed to it)."""

    def __init__(self) -> None:
        self.items: collections.deque[TokenResponse] = collections.deque()

    def __iter__(self) -> Iterator[TokenResponse]:
        return self

    def __next__(self) -> TokenResponse:
        return self.items.popleft()


@dataclass
class _Live:
    """A job while it generates: its generation, its tool-call reader and the last token it got."""

    job: Job
    gen: Generation
    feed: _Feed
    responses: Iterator[ChatResponse] = field(default_factory=lambda: iter(()))
    last: TokenResponse | None = None
    t0: float = field(default_factory=time.perf_counter)
