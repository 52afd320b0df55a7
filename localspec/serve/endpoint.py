"""What the two generation endpoints share (:class:`Endpoint`): a validated request turned into a queued
job, and the job's events into an OpenAI response, whole (JSON) or streamed (server-sent events)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import queue
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from localspec.gguf.meta import model_file_stem
from localspec.pipeline.tool_calls import NO_TOOLS, ToolUse
from localspec.serve.metrics import Metrics
from localspec.serve.options import ServeOptions
from localspec.serve.schemas import APIError, ChatRequest, CommonRequest
from localspec.serve.worker import EndEvent, ErrorEvent, Job, JobEvent, TokenEvent, Worker

if TYPE_CHECKING:
    from localspec.pipeline.api import Pipeline


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

    def __init__(self, content: AsyncIterator[bytes], job: Job) -> None:
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


async def _watch_disconnect(request: Request, job: Job) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return


class Endpoint:
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

    def kwargs(self, req: CommonRequest, prompt_len: int, extra_stops: list[str]) -> dict[str, Any]:
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
        req: CommonRequest,
        tokens: list[int],
        kw: dict[str, Any],
        kind: str,
        tools: ToolUse = NO_TOOLS,
    ):
        endpoint = "chat" if kind == "chat" else "completions"
        job = Job(tokens, kw, asyncio.get_running_loop(), endpoint, tools=tools)
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
        if isinstance(first, ErrorEvent):
            await self._drain(job)
            raise first.error
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        if req.stream:
            return _JobStream(self._sse(job, first, rid, kind, req), job)
        return await self._collect(request, job, first, rid, kind)

    async def _next(self, request: Request, job: Job) -> JobEvent | None:
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

    async def _drain(self, job: Job) -> None:
        while not isinstance(await job.events.get(), EndEvent):
            pass

    def _usage(self, job: Job, stats: dict[str, Any] | None, generated: int) -> dict[str, int]:
        completion = int((stats or {}).get("generated_tokens") or generated)
        return {
            "prompt_tokens": len(job.tokens),
            "completion_tokens": completion,
            "total_tokens": len(job.tokens) + completion,
        }

    async def _collect(self, request: Request, job: Job, first: JobEvent, rid: str, kind: str):
        pieces: list[str] = []
        finish = None
        generated = 0
        event = first
        # One watcher for the whole generation: a client that leaves sets job.cancel, the worker stops
        # after the token in flight and sends "end".
        watch = asyncio.ensure_future(_watch_disconnect(request, job))
        try:
            while True:
                if isinstance(event, TokenEvent):
                    pieces.append(event.text)
                    generated += 1
                    finish = event.finish_reason or finish
                elif isinstance(event, ErrorEvent):
                    await self._drain(job)
                    raise event.error
                else:  # EndEvent
                    stats = event.stats
                    break
                event = await job.events.get()
        finally:
            watch.cancel()
        if finish is None:
            if watch.done() and not watch.cancelled():  # the client left: nobody reads this
                return Response(status_code=499)
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": int(time.time()),
                "model": self.model_id,
                "system_fingerprint": None,
                "choices": [_whole_choice(kind, "".join(pieces), finish, job.tools)],
                "usage": self._usage(job, stats, generated),
                "localspec": _localspec_stats(stats, self.pipe, job.queue_seconds),
            }
        )

    async def _sse(
        self, job: Job, first: JobEvent, rid: str, kind: str, req: CommonRequest
    ) -> AsyncIterator[bytes]:
        chat = kind == "chat"
        base = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            "system_fingerprint": None,
        }
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunk = functools.partial(_chunk, base, chat, include_usage)

        if chat:
            role = chunk("", None)
            role["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            yield _sse(role)
        finish = None
        generated = 0
        called = False
        event = first
        while True:
            if isinstance(event, TokenEvent):
                generated += 1
                finish = event.finish_reason or finish
                # a chat's content (calls read out), and its calls' name, then arguments, as they come
                text = event.content if chat else event.text
                if text:
                    yield _sse(chunk(text, None))
                if event.tool_calls:
                    called = True
                    yield _sse(chunk(None, None, event.tool_calls))
            elif isinstance(event, ErrorEvent):
                yield _sse(event.error.body())
                await self._drain(job)
                return
            else:  # EndEvent
                stats = event.stats
                break
            # One turn of the event loop between two chunks: once a write finds the client gone, uvicorn
            # learns it (connection_lost) before the next, and drops the rest of a step's burst of tokens;
            # without the turn every queued token was written to the dead socket (asyncio's "socket.send()
            # raised exception." in the log, about one abandoned stream in five).
            await asyncio.sleep(0)
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


def _whole_choice(kind: str, text: str, finish: str | None, tools: ToolUse) -> dict[str, Any]:
    """The one choice of a whole (not streamed) answer: a chat's message, its calls read out, or the text."""
    if kind != "chat":
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    content, calls = tools.split(text)  # (the text as it is when no tools were offered)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message = {"role": "assistant", "content": content or None, "tool_calls": calls}
        finish = _calls_finish(finish)
    return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}


def _chunk(
    base: dict[str, Any],
    chat: bool,
    include_usage: bool,
    text: str | None,
    finish: str | None,
    calls: list | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One streamed chunk: a chat's ``delta`` (content, tool-call entries) or a completion's text."""
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


def _waiting(n: int) -> str:
    return f"{n} request is" if n == 1 else f"{n} requests are"


def _calls_finish(finish: str | None) -> str | None:
    """A reply that called tools ends with ``tool_calls`` (OpenAI's reason), unless it was cut short."""
    return finish if finish == "length" else "tool_calls"
