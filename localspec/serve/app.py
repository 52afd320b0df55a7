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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import math
import queue
import signal
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from localspec.constrain.grammar import reply_grammar
from localspec.errors import GrammarError, LocalspecError, MessageError
from localspec.gguf.meta import model_file_stem
from localspec.pipeline.tool_calls import NO_TOOLS, ToolCallError, ToolUse, chat_messages, tool_use
from localspec.serve.exposure import check_exposure, is_loopback
from localspec.settings import STRATEGIES

if TYPE_CHECKING:
    from localspec.pipeline.api import Pipeline

log = logging.getLogger("localspec.serve.app")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUE = 64
DEFAULT_MAX_BODY_BYTES = 8_000_000  # 8 MB (decimal, as localspec.units formats it)
API_KEY_ENV = "LOCALSPEC_API_KEY"
MAX_STOP_STRINGS = 16


@dataclass(frozen=True)
class ServeOptions:
    """How the endpoint listens and what it accepts.

    ``model_id`` is the id ``/v1/models`` reports (default: the target's file name without ``.gguf``);
    it and every name in ``aliases`` (e.g. the preset's name) are accepted as a request's ``model``.
    ``strategy`` overrides the pipeline's drafting strategy for every request (one of
    :data:`localspec.settings.STRATEGIES`).
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    insecure_no_auth: bool = False
    max_queue: int = DEFAULT_MAX_QUEUE
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    model_id: str | None = None
    aliases: tuple[str, ...] = ()
    strategy: str | None = None

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ServeError(
                "the API key is empty", hint=f"give a non-empty --api-key (or {API_KEY_ENV}), or leave it out"
            )
        if self.max_queue < 1:
            raise ServeError(f"max queue {self.max_queue} must be at least 1", hint="e.g. --max-queue 64")
        if self.max_body_bytes < 1024:
            raise ServeError(
                f"a body limit of {self.max_body_bytes} bytes is too small for any request",
                hint="use at least 1 KB (the default is 8 MB)",
            )
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise ServeError(
                f"strategy {self.strategy!r} is not one of {', '.join(STRATEGIES)}",
                hint="leave --strategy out to use the pair's own",
            )


class ServeError(LocalspecError, ValueError):
    """A server option that cannot work, or an address that cannot be bound."""


def exposure_line(opts: ServeOptions) -> str:
    """The exposure rule for this endpoint: raises ``ExposureError`` for an exposed bind without a key."""
    return check_exposure(
        opts.host,
        what="the HTTP API",
        has_auth=opts.api_key is not None,
        insecure_no_auth=opts.insecure_no_auth,
        auth_flag=f"--api-key KEY (or set {API_KEY_ENV})",
    )


# ------------------------------------------------------------------------------------------- errors
class APIError(Exception):
    """An error answered to the client as OpenAI-style JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _from_localspec(exc: LocalspecError, status: int = 400, code: str | None = None) -> APIError:
    message = exc.message + (f" ({exc.hint})" if exc.hint else "")
    return APIError(status, message, param=getattr(exc, "param", None), code=code)


# ------------------------------------------------------------------------------------------- requests
class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    """Fields both endpoints share. Unknown fields are ignored (clients send many); fields localspec
    cannot honour are refused when set to anything but their neutral value (see :func:`_refuse`)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    stream: bool = False
    stream_options: _StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)  # llama.cpp-style extension
    min_p: float = Field(default=0.0, ge=0.0, lt=1.0)  # llama.cpp-style extension
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    n: int = 1
    # Refused unless neutral:
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


def _param(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[str]", "list[dict[str,any]]") or "[" in str(part):
            continue  # pydantic names the union member it tried; the client does not need it
        else:
            out += f".{part}" if out else str(part)
    return out


def _validate(model: type[BaseModel], body: bytes) -> Any:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        if err["type"] == "json_invalid":
            raise APIError(400, f"the request body is not valid JSON: {err['msg']}") from None
        param = _param(tuple(err["loc"])) or None
        if err["type"] == "missing":
            raise APIError(400, f"missing required parameter {param!r}", param=param) from None
        where = f"{param}: " if param else "the request body: "
        raise APIError(400, where + err["msg"], param=param) from None


def _refuse(req: _Common) -> None:
    """Parameters that would change the answer in ways localspec does not implement: a clear 400."""

    def no(param: str, why: str) -> None:
        raise APIError(400, f"{param}: {why}", param=param, code="unsupported_parameter")

    if req.n != 1:
        no("n", f"only n=1 is supported (one loaded pair serves one completion at a time), got {req.n}")
    if req.logprobs not in (None, False, 0) or req.top_logprobs not in (None, 0):
        no("logprobs", "log probabilities are not returned by localspec serve")
    if req.logit_bias:
        no("logit_bias", "logit bias is not supported")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            no(name, "repetition penalties are not supported (they would change the target's distribution)")
    if isinstance(req, ChatRequest):
        if req.functions or req.function_call:
            no("functions", "the legacy functions/function_call are not supported: send them as tools")
    if isinstance(req, CompletionRequest):
        if req.echo:
            no("echo", "echo is not supported")
        if req.best_of not in (None, 1):
            no("best_of", "only best_of=1 is supported")
        if req.suffix:
            no("suffix", "suffix (fill-in-the-middle) is not supported")
    if isinstance(req.stop, list) and len(req.stop) > MAX_STOP_STRINGS:
        no("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(req.stop)}")


# ------------------------------------------------------------------------------------------- worker
@dataclass
class _Job:
    """One queued generation and the channel its events travel on (worker thread -> event loop)."""

    tokens: list[int]
    kwargs: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    endpoint: str = "completions"  # "chat" | "completions": the label of its outcome in /metrics
    tools: ToolUse = NO_TOOLS  # a chat's: how its tokens read as content and tool calls
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.perf_counter)
    queue_seconds: float = 0.0

    def emit(self, *item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
            self.cancel.set()


class Metrics:
    """Counters for ``/metrics`` and ``/health``; updated by the worker and the handlers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str], int] = {}
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.generation_seconds = 0.0
        self.last_tokens_per_second = 0.0
        self.recent_job_seconds = 0.0  # moving average, for Retry-After

    def count(self, endpoint: str, outcome: str) -> None:
        with self._lock:
            key = (endpoint, outcome)
            self.requests[key] = self.requests.get(key, 0) + 1

    def finished(self, stats: dict[str, Any], seconds: float) -> None:
        with self._lock:
            self.prompt_tokens += int(stats.get("prompt_tokens") or 0)
            self.generated_tokens += int(stats.get("generated_tokens") or 0)
            self.drafted += int(stats.get("drafted") or 0)
            self.accepted += int(stats.get("accepted") or 0)
            self.generation_seconds += float(stats.get("total_seconds") or 0.0)
            self.last_tokens_per_second = float(stats.get("tokens_per_second") or 0.0)
            a = 0.3
            self.recent_job_seconds = (
                seconds if not self.recent_job_seconds else (a * seconds + (1 - a) * self.recent_job_seconds)
            )

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": dict(self.requests),
                "prompt_tokens": self.prompt_tokens,
                "generated_tokens": self.generated_tokens,
                "drafted": self.drafted,
                "accepted": self.accepted,
                "generation_seconds": self.generation_seconds,
                "last_tokens_per_second": self.last_tokens_per_second,
                "recent_job_seconds": self.recent_job_seconds,
            }


class Worker:
    """The single thread that runs queued generations one at a time, in arrival order."""

    def __init__(self, pipe: Pipeline, metrics: Metrics, *, max_queue: int) -> None:
        self.pipe = pipe
        self.metrics = metrics
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.busy = False

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="localspec-serve-worker", daemon=True)
            self._thread.start()

    def submit(self, job: _Job) -> None:
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
                job.emit("error", APIError(503, "the server is shutting down", type="server_error"))
                job.emit("end", None)
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
                job.emit("end", None)
                continue
            self.busy = True
            t0 = time.perf_counter()
            try:
                self._generate(job)
            finally:
                self.busy = False
                log.debug("job done in %.3f s", time.perf_counter() - t0)

    def _generate(self, job: _Job) -> None:
        stream = None
        last = None
        outcome = "cancelled"
        t0 = time.perf_counter()
        try:
            stream = self.pipe.stream_tokens(job.tokens, **job.kwargs)
            for r in job.tools.responses(stream):  # (content is the text when no tools were offered)
                last = r
                job.emit("token", r.text, r.from_draft, r.finish_reason, r.content, r.tool_calls)
                if r.finish_reason:
                    outcome = "ok"
                    break  # the answer is complete: the client gets it before the stream is closed
                if job.cancel.is_set() or self._stopping.is_set():
                    break
        except LocalspecError as exc:
            outcome = "error"
            job.emit("error", _from_localspec(exc))
        except ValueError as exc:
            outcome = "error"
            job.emit("error", APIError(400, str(exc)))
        except Exception as exc:  # a bug: the client gets a 500 without a traceback, the log gets it
            outcome = "error"
            log.exception("generation failed")
            job.emit(
                "error",
                APIError(
                    500, f"internal error ({type(exc).__name__}); see the server's log", type="server_error"
                ),
            )
        finally:
            stats = last.stats.as_dict() if last is not None else None
            if stats is not None:
                self.metrics.finished(stats, time.perf_counter() - t0)
            self.metrics.count(job.endpoint, outcome)
            job.emit("end", stats)
            # Then the engine's finally, in this thread and before the next job: it puts the KV cache
            # right and feeds the suffix cache (a request's indexing, now and then a merge of its parts,
            # and the store's save: a few ms, at times a second or more with millions of stored
            # tokens), which no client waits for now. An error there is logged, never the worker's end.
            if isinstance(stream, Generator):
                try:
                    stream.close()
                except Exception:
                    log.exception("closing a finished generation failed")


# ------------------------------------------------------------------------------------------- responses
def _localspec_stats(stats: dict[str, Any] | None, pipe: Pipeline, queue_seconds: float) -> dict[str, Any]:
    """The ``localspec`` object of a final response or chunk."""
    s = stats or {}
    memory = s.get("memory") or {}
    return {
        "strategy": s.get("strategy"),
        "draft": s.get("draft_name"),
        "pair": pipe.info.note,
        "drafted": s.get("drafted", 0),
        "accepted": s.get("accepted", 0),
        "acceptance": s.get("acceptance_rate", 0.0),
        "mean_accepted_length": s.get("mean_accepted_length", 0.0),
        "tokens_per_second": s.get("tokens_per_second", 0.0),
        "draft_memory_overhead_bytes": memory.get("draft_overhead_bytes", 0),
        "queue_seconds": round(queue_seconds, 4),
        "prompt_seconds": round(float(s.get("prompt_seconds") or 0.0), 4),
        "generation_seconds": round(float(s.get("total_seconds") or 0.0), 4),
    }


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


class _JobStream(StreamingResponse):
    """Server-sent events for one job; however the response ends (done, client gone, server stopping),
    the job is cancelled so the worker stops within one round."""

    def __init__(self, content: AsyncIterator[bytes], job: _Job) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    with contextlib.suppress(OSError):
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            self.job.cancel.set()


async def _watch_disconnect(request: Request, job: _Job) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return


# ------------------------------------------------------------------------------------------- the app
class _Endpoint:
    """What the two generation endpoints share: turning a validated request into a queued job and the
    job's events into an OpenAI response."""

    def __init__(self, pipe: Pipeline, opts: ServeOptions, worker: Worker, metrics: Metrics) -> None:
        self.pipe, self.opts, self.worker, self.metrics = pipe, opts, worker, metrics
        self.model_id = opts.model_id or model_file_stem(pipe.info.target_path)
        self.names = (self.model_id, *[a for a in opts.aliases if a and a != self.model_id])

    def check_model(self, name: str) -> None:
        if name not in self.names:
            raise APIError(
                404,
                f"the model {name!r} does not exist here; this server serves "
                f"{', '.join(map(repr, self.names))} (GET /v1/models lists it)",
                param="model",
                code="model_not_found",
            )

    def kwargs(self, req: _Common, prompt_len: int, extra_stops: list[str]) -> dict[str, Any]:
        pipe = self.pipe
        room = pipe.n_ctx - prompt_len
        if room < 1:
            more = (
                f": the model was trained on {pipe.info.n_ctx_train} tokens, the most it is loaded with"
                if pipe.n_ctx_is_trained
                else " (or restart the server with a larger --n-ctx)"
            )
            raise APIError(
                400,
                f"the prompt is {prompt_len} tokens, and the context window holds {pipe.n_ctx}"
                f"{pipe.n_ctx_note()}: it leaves no room for an answer; shorten the prompt{more}",
                param="messages" if isinstance(req, ChatRequest) else "prompt",
                code="context_length_exceeded",
            )
        wanted = (
            req.max_completion_tokens if isinstance(req, ChatRequest) and req.max_completion_tokens else None
        )
        wanted = wanted or req.max_tokens or room
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        kw: dict[str, Any] = dict(
            max_tokens=min(wanted, room),
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=req.seed,
            stop=[s for s in stops + extra_stops if s] or None,
        )
        if self.opts.strategy is not None:
            kw["strategy"] = self.opts.strategy
        return kw

    async def run(
        self,
        request: Request,
        req: _Common,
        tokens: list[int],
        kw: dict[str, Any],
        kind: str,
        tools: ToolUse = NO_TOOLS,
    ):
        endpoint = "chat" if kind == "chat" else "completions"
        job = _Job(tokens, kw, asyncio.get_running_loop(), endpoint, tools=tools)
        try:
            self.worker.submit(job)
        except queue.Full:
            self.metrics.count(endpoint, "rejected")
            wait = self.worker.retry_after()
            raise APIError(
                429,
                f"the server is busy: {_waiting(self.worker.waiting)} already waiting (--max-queue); "
                f"retry in about {wait} s",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(wait)},
            ) from None
        # Wait for the first token (or an error) while watching for the client leaving: a stream's
        # status line and headers go out only once the generation has really started.
        first = await self._next(request, job)
        if first is None:
            return Response(status_code=499)  # nobody is there to read it
        if first[0] == "error":
            await self._drain(job)
            raise first[1]
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        if req.stream:
            return _JobStream(self._sse(job, first, rid, kind, req), job)
        return await self._collect(request, job, first, rid, kind)

    async def _next(self, request: Request, job: _Job) -> tuple | None:
        """The job's next event, or None when the client disconnected first (the job is then cancelled)."""
        get = asyncio.ensure_future(job.events.get())
        watch = asyncio.ensure_future(_watch_disconnect(request, job))
        try:
            await asyncio.wait({get, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not get.done():
                get.cancel()
        if get.done() and not get.cancelled():
            return get.result()
        return None

    async def _drain(self, job: _Job) -> None:
        while (await job.events.get())[0] != "end":
            pass

    def _usage(self, job: _Job, stats: dict[str, Any] | None, generated: int) -> dict[str, int]:
        completion = int((stats or {}).get("generated_tokens") or generated)
        return {
            "prompt_tokens": len(job.tokens),
            "completion_tokens": completion,
            "total_tokens": len(job.tokens) + completion,
        }

    async def _collect(self, request: Request, job: _Job, first: tuple, rid: str, kind: str):
        pieces: list[str] = []
        finish = None
        generated = 0
        event = first
        # One watcher for the whole generation: a client that leaves sets job.cancel, the worker stops
        # after the token in flight and sends "end".
        watch = asyncio.ensure_future(_watch_disconnect(request, job))
        try:
            while True:
                if event[0] == "token":
                    pieces.append(event[1])
                    generated += 1
                    finish = event[3] or finish
                elif event[0] == "error":
                    await self._drain(job)
                    raise event[1]
                elif event[0] == "end":
                    stats = event[1]
                    break
                event = await job.events.get()
        finally:
            watch.cancel()
        if finish is None:
            if watch.done() and not watch.cancelled():  # the client left: nobody reads this
                return Response(status_code=499)
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        text = "".join(pieces)
        choice: dict[str, Any]
        if kind == "chat":
            content, calls = job.tools.split(text)  # (the text as it is when no tools were offered)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message = {"role": "assistant", "content": content or None, "tool_calls": calls}
                finish = _calls_finish(finish)
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": int(time.time()),
                "model": self.model_id,
                "system_fingerprint": None,
                "choices": [choice],
                "usage": self._usage(job, stats, generated),
                "localspec": _localspec_stats(stats, self.pipe, job.queue_seconds),
            }
        )

    async def _sse(self, job: _Job, first: tuple, rid: str, kind: str, req: _Common) -> AsyncIterator[bytes]:
        chat = kind == "chat"
        base = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            "system_fingerprint": None,
        }
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(
            text: str | None, finish: str | None, calls: list | None = None, **extra: Any
        ) -> dict[str, Any]:
            if chat:
                delta: dict[str, Any] = {} if text is None else {"content": text}
                if calls:
                    delta["tool_calls"] = calls
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            out = {**base, "choices": [choice], **extra}
            if include_usage:
                out["usage"] = None
            return out

        if chat:
            role = chunk("", None)
            role["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            yield _sse(role)
        finish = None
        generated = 0
        called = False
        event = first
        while True:
            if event[0] == "token":
                _, text, _from_draft, reason, content, deltas = event
                generated += 1
                finish = reason or finish
                # a chat's content (calls read out), and its calls' name, then arguments, as they come
                text = content if chat else text
                if text:
                    yield _sse(chunk(text, None))
                if deltas:
                    called = True
                    yield _sse(chunk(None, None, deltas))
            elif event[0] == "error":
                yield _sse(event[1].body())
                await self._drain(job)
                return
            elif event[0] == "end":
                stats = event[1]
                break
            event = await job.events.get()
        if finish is None:
            yield _sse(APIError(503, "the server is shutting down", type="server_error").body())
            return
        if called:
            finish = _calls_finish(finish)
        ours = _localspec_stats(stats, self.pipe, job.queue_seconds)
        yield _sse(chunk(None, finish, localspec=ours))
        if include_usage:  # the last chunk carries it too, as the docs promise of the final chunk
            yield _sse(
                {**base, "choices": [], "usage": self._usage(job, stats, generated), "localspec": ours}
            )
        yield b"data: [DONE]\n\n"


def _generation_endpoint(path: str) -> str | None:
    """The ``/metrics`` endpoint label of a generation path, None for any other path."""
    if path.endswith("/chat/completions"):
        return "chat"
    return "completions" if path.endswith("/completions") else None


def _waiting(n: int) -> str:
    return f"{n} request is" if n == 1 else f"{n} requests are"


def _calls_finish(finish: str | None) -> str | None:
    """A reply that called tools ends with ``tool_calls`` (OpenAI's reason), unless it was cut short."""
    return finish if finish == "length" else "tool_calls"


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it passes ``limit`` bytes: before any parsing."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype and ctype != "application/json":
        # Also keeps web pages from posting forms or text/plain to a local server (no CORS preflight).
        raise APIError(
            415,
            f"the body must be JSON (Content-Type: application/json), got {ctype!r}",
            code="bad_content_type",
        )
    declared = request.headers.get("content-length")
    too_big = APIError(
        413,
        f"the request body is larger than {limit} bytes (--max-body-mb)",
        code="request_too_large",
    )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _prometheus(metrics: Metrics, worker: Worker, model_id: str) -> str:
    snap = metrics.snapshot()
    lines: list[str] = []

    def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP localspec_{name} {help}")
        lines.append(f"# TYPE localspec_{name} {kind}")
        for labels, value in samples:
            lines.append(f"localspec_{name}{labels} {value!r}")

    model = model_id.replace("\\", "\\\\").replace('"', '\\"')
    reqs = sorted(snap["requests"].items())
    metric(
        "requests_total",
        "counter",
        "Queued generations by endpoint and outcome (ok, error, cancelled), requests refused "
        "because the queue was full (rejected) and requests refused before queueing, a 4xx (refused).",
        [(f'{{endpoint="{e}",outcome="{o}"}}', n) for (e, o), n in reqs]
        or [('{endpoint="chat",outcome="ok"}', 0)],
    )
    metric(
        "prompt_tokens_total",
        "counter",
        "Prompt tokens of finished generations.",
        [("", snap["prompt_tokens"])],
    )
    metric("generated_tokens_total", "counter", "Tokens generated.", [("", snap["generated_tokens"])])
    metric("drafted_tokens_total", "counter", "Tokens proposed by the drafter.", [("", snap["drafted"])])
    metric(
        "accepted_tokens_total", "counter", "Drafted tokens the target accepted.", [("", snap["accepted"])]
    )
    acceptance = snap["accepted"] / snap["drafted"] if snap["drafted"] else 0.0
    metric("acceptance_ratio", "gauge", "Accepted / drafted tokens since start.", [("", float(acceptance))])
    metric(
        "generation_seconds_total",
        "counter",
        "Time spent generating.",
        [("", float(snap["generation_seconds"]))],
    )
    metric(
        "tokens_per_second",
        "gauge",
        "Generation speed of the last finished request.",
        [("", float(snap["last_tokens_per_second"]))],
    )
    metric("queue_length", "gauge", "Requests waiting for the worker.", [("", worker.waiting)])
    metric("busy", "gauge", "1 while a generation runs.", [("", int(worker.busy))])
    metric("info", "gauge", "The served model.", [(f'{{model="{model}"}}', 1)])
    return "\n".join(lines) + "\n"


class _LoopbackHosts:
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


class _InternalErrors:
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


def create_app(pipe: Pipeline, opts: ServeOptions | None = None) -> FastAPI:
    """The ASGI app: OpenAI routes, ``/health`` and ``/metrics`` over ``pipe``. The worker thread starts
    and stops with the app's lifespan."""
    opts = opts or ServeOptions()
    metrics = Metrics()
    worker = Worker(pipe, metrics, max_queue=opts.max_queue)
    ep = _Endpoint(pipe, opts, worker, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        worker.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(worker.stop)

    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.worker, app.state.metrics, app.state.endpoint = worker, metrics, ep
    if is_loopback(opts.host):
        # A loopback server is reachable from this machine's browser; refusing foreign Host headers stops
        # web pages from reading it through DNS rebinding.
        names = {"127.0.0.1", "localhost", "::1", "[::1]", opts.host.lower(), opts.host.strip("[]").lower()}
        app.add_middleware(_LoopbackHosts, names=names)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        endpoint = _generation_endpoint(request.url.path)
        if endpoint and 400 <= exc.status < 500 and exc.status != 429:  # a full queue counts as rejected
            metrics.count(endpoint, "refused")
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            msg = (
                f"no such endpoint: {request.method} {request.url.path} "
                "(see GET /v1/models, POST /v1/chat/completions)"
            )
            return APIError(404, msg, code="unknown_url").response()
        if exc.status_code == 405:
            msg = f"{request.method} is not allowed on {request.url.path}"
            msg += ": send a POST with a JSON body" if _generation_endpoint(request.url.path) else ": use GET"
            return APIError(405, msg, code="method_not_allowed").response()
        return APIError(exc.status_code, str(exc.detail)).response()

    app.add_middleware(_InternalErrors)

    def authorize(request: Request) -> None:
        if opts.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        given = token.strip().encode() if scheme.lower() == "bearer" else b""
        if not hmac.compare_digest(given, opts.api_key.encode()):
            raise APIError(
                401,
                "missing or wrong API key: send the server's key as 'Authorization: Bearer KEY'"
                if given
                else "this server needs an API key: send 'Authorization: Bearer KEY'",
                type="authentication_error",
                code="invalid_api_key",
            )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": ep.model_id, "queue": worker.waiting, "busy": worker.busy}

    @app.get("/metrics")
    async def prometheus(request: Request) -> PlainTextResponse:
        authorize(request)
        return PlainTextResponse(
            _prometheus(metrics, worker, ep.model_id), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        return {"object": "list", "data": [model_entry(name) for name in ep.names]}

    @app.get("/v1/models/{name:path}")
    async def model(request: Request, name: str) -> dict[str, Any]:
        authorize(request)
        ep.check_model(name)
        return model_entry(name)

    def model_entry(name: str) -> dict[str, Any]:
        """A model as both model endpoints describe it; ``created`` is the target file's time."""
        path = pipe.info.target_path
        created = int(path.stat().st_mtime) if path.exists() else 0
        return {"id": name, "object": "model", "created": created, "owned_by": "localspec"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        authorize(request)
        req = _validate(ChatRequest, await _read_body(request, opts.max_body_bytes))
        ep.check_model(req.model)
        _refuse(req)
        try:
            messages = chat_messages(req.messages)
            tools = tool_use(
                req.tools, req.tool_choice, pipe.chat_template, parallel=req.parallel_tool_calls is not False
            )
            grammar = reply_grammar(req.response_format, reads_calls=tools.read_calls)
        except (ToolCallError, GrammarError, MessageError) as exc:
            message = exc.message + (f"; {exc.hint}" if exc.hint else "")
            code = "unsupported_parameter" if getattr(exc, "unsupported", False) else None
            raise APIError(400, message, param=exc.param, code=code) from None
        format_chat = functools.partial(pipe.format_chat, tools=tools.tools)
        try:
            tokens, stops = await anyio.to_thread.run_sync(format_chat, messages)
        except LocalspecError as exc:
            raise _from_localspec(exc) from None
        except Exception as exc:  # the model's chat template refused the messages (jinja raise_exception)
            raise APIError(
                400, f"the model's chat template refused these messages: {exc}", param="messages"
            ) from None
        kwargs = ep.kwargs(req, len(tokens), stops)
        if grammar or tools.grammar:  # never both: response_format is refused where calls are read
            kwargs["grammar"] = grammar or tools.grammar
        return await ep.run(request, req, tokens, kwargs, "chat", tools)

    @app.post("/v1/completions")
    async def completions(request: Request):
        authorize(request)
        req = _validate(CompletionRequest, await _read_body(request, opts.max_body_bytes))
        ep.check_model(req.model)
        _refuse(req)
        prompt = req.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise APIError(400, f"one prompt per request, got {len(prompt)}", param="prompt")
            prompt = prompt[0]
        tokens = await anyio.to_thread.run_sync(pipe.tokenize, prompt)
        if not tokens:
            raise APIError(400, "the prompt is empty", param="prompt")
        return await ep.run(request, req, tokens, ep.kwargs(req, len(tokens), []), "completions")

    return app


# ------------------------------------------------------------------------------------------- running
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
    ep: _Endpoint = app.state.endpoint
    names = ep.model_id + (f" (also: {', '.join(ep.names[1:])})" if len(ep.names) > 1 else "")
    echo(f"localspec serve: OpenAI-compatible API at {_url(opts.host, port)}  model {names}")
    echo(f"  pair: {pipe.info.note}; context {pipe.n_ctx} tokens{pipe.n_ctx_note()}")
    echo(f"  one request at a time, up to {opts.max_queue} waiting")
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
