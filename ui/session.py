"""The one loaded pipeline the page works with, kept between runs.

Switching to another pair closes the old pipeline first (frees both models); a Stop
request makes the running stream *of the session that asked* end at the next token, or its benchmark
after the run in progress (each browser session has its own stop flag: one visitor's Stop never ends
another's run), and cancels that session's runs still waiting in the queue; the stream is always
closed (``generator.close()``) so the engine rewinds its caches. A page that is closed or reloaded
ends its session the same way, its queued runs included (``request_stop(page_gone=True)``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.units import format_bytes

if TYPE_CHECKING:
    from localspec.pipeline.pipeline import Pipeline


@dataclass(frozen=True)
class PairSpec:
    """What to load: a preset name, or a target path with a draft (path, "ngram", "none" or None)."""

    preset: str | None = None
    target: str | None = None
    draft: str | None = None
    n_ctx: int | None = None  # None: the preset's context, else the library default
    n_gpu_layers: int = 0
    draft_n_gpu_layers: int = 0
    n_threads: int | None = None  # None: the library's default (`localspec ui --threads`)
    rpc: str | None = None  # llama.cpp rpc-servers for the target's layers (``HOST:PORT,...``), checked
    mtp: bool = False  # load the target's MTP layers (an MTP strategy is chosen)

    def load_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.n_ctx:
            kw["n_ctx"] = self.n_ctx
        if self.n_threads:
            kw["n_threads"] = self.n_threads
        if self.n_gpu_layers:
            kw["n_gpu_layers"] = self.n_gpu_layers
        if self.draft_n_gpu_layers:
            kw["draft_n_gpu_layers"] = self.draft_n_gpu_layers
        if self.rpc:
            kw["rpc"] = self.rpc
        if self.mtp:
            kw["strategy"] = "mtp"
        if self.preset:
            kw["preset"] = self.preset
        else:
            kw["target"] = self.target
            kw["draft"] = self.draft
        return kw

    def loading_text(self) -> str:
        """What the page says while this pair loads: the files and their sizes (a 7B+ target takes a while
        to read from disk the first time)."""
        if self.preset:
            return f"loading preset {self.preset}..."
        parts = []
        for what, name in (("target", self.target), ("draft", self.draft)):
            path = Path(name or "")
            try:
                size = path.stat().st_size if path.is_file() else 0  # not "ngram", "none" or missing
            except OSError:
                size = 0
            if size:
                parts.append(f"{what} {path.name}, {format_bytes(size)}")
        return f"loading the pair ({'; '.join(parts)})..." if parts else "loading the pair..."

    def label(self) -> str:
        if self.preset:
            return f"preset {self.preset}"
        return f"{self.target} + {self.draft or 'automatic draft'}"


@dataclass
class PipelineHolder:
    """Holds at most one pipeline. ``loader`` is ``localspec.load`` (injectable for tests)."""

    loader: Callable[..., Pipeline]
    spec: PairSpec | None = None
    pipe: Pipeline | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _stops: dict[str, threading.Event] = field(default_factory=dict)  # per session, while it streams
    _stopped: set[str] = field(default_factory=set)  # sessions whose last stream ended on Stop
    _stops_lock: threading.Lock = field(default_factory=threading.Lock)  # never held while loading
    _stream: Iterator[Any] | None = None
    #: per session: runs queued (clicks), runs started, and the count up to which queued ones are cancelled
    _requested: dict[str, int] = field(default_factory=dict)
    _started: dict[str, int] = field(default_factory=dict)
    _cancelled: dict[str, int] = field(default_factory=dict)

    def loaded(self, spec: PairSpec) -> bool:
        """Whether ``spec`` is the pipeline held now (nothing to load)."""
        return self.pipe is not None and self.spec == spec

    def get(self, spec: PairSpec, progress: Callable[[str, int, int], None] | None = None) -> Pipeline:
        """The pipeline for ``spec``: reused if loaded, else the old one is closed and a new one loaded."""
        with self._lock:
            if self.pipe is not None and self.spec == spec:
                return self.pipe
            self.close()
            kwargs = spec.load_kwargs()
            if progress is not None:
                kwargs["progress"] = progress
            self.pipe = self.loader(**kwargs)
            self.spec = spec
            return self.pipe

    def close(self) -> None:
        with self._lock:
            self._close_stream()
            if self.pipe is not None:
                try:
                    self.pipe.close()
                finally:
                    self.pipe, self.spec = None, None

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Hold the pipeline for one blocking call (compare, bench) so nothing else switches it meanwhile."""
        with self._lock:
            yield

    # -- Stop: a running stream or bench, or a request still waiting in the queue --------------------

    def note_request(self, session: str = "") -> None:
        """A click that queues a run for ``session`` (called unqueued, as the click happens): a Stop
        before the run starts cancels it (:meth:`claim`)."""
        with self._stops_lock:
            if len(self._requested) > 1000:  # stale sessions (closed pages): forget them
                for counts in (self._requested, self._started, self._cancelled):
                    counts.clear()
            self._requested[session] = self._requested.get(session, 0) + 1

    def claim(self, session: str = "") -> bool:
        """Called when a queued run of ``session`` starts: False when its Stop came while it waited."""
        with self._stops_lock:
            started = self._started[session] = self._started.get(session, 0) + 1
            return started > self._cancelled.get(session, 0)

    def request_stop(self, session: str = "", *, page_gone: bool = False) -> None:
        """Stop what ``session`` (a browser session) runs, if anything; nobody else's. With nothing
        running, the runs it has waiting in the queue are cancelled instead. ``page_gone`` (its page was
        closed or reloaded, so no Stop can follow): those queued runs are cancelled in any case."""
        with self._stops_lock:
            event = self._stops.get(session)
            waiting = self._requested.get(session, 0) > self._started.get(session, 0)
            if waiting and (event is None or page_gone):
                self._cancelled[session] = self._requested[session]
        if event is not None:
            event.set()

    @contextmanager
    def stoppable(self, session: str = "") -> Iterator[threading.Event]:
        """An event that ``session``'s Stop sets while the block runs (a stream's tokens, a bench's runs)."""
        event = threading.Event()
        with self._stops_lock:
            self._stops[session] = event
            self._stopped.discard(session)
        try:
            yield event
        finally:
            with self._stops_lock:
                if self._stops.get(session) is event:
                    del self._stops[session]
                if event.is_set():
                    if len(self._stopped) > 1000:  # stale sessions (closed pages): forget them
                        self._stopped.clear()
                    self._stopped.add(session)

    def stream(self, make: Callable[[], Iterator[Any]], *, session: str = "") -> Generator[Any, None, None]:
        """Iterate ``make()`` for ``session``, ending early on its Stop; the inner generator is closed in
        every case."""
        with self.stoppable(session) as event:
            with self._lock:
                self._close_stream()
                inner = make()
                self._stream = inner
            try:
                for item in inner:
                    yield item
                    if event.is_set():
                        break
            finally:
                with self._lock:
                    self._close_stream()

    def was_stopped(self, session: str = "") -> bool:
        """True when the last stream of ``session`` ended because that session pressed Stop."""
        with self._stops_lock:
            return session in self._stopped

    def _close_stream(self) -> None:
        inner, self._stream = self._stream, None
        if inner is not None:
            close = getattr(inner, "close", None)
            if close is not None:
                try:
                    close()
                except ValueError:  # "generator already executing": its own thread will close it
                    pass
