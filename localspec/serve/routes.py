"""The ASGI app (:func:`create_app`): OpenAI's routes, ``/health`` and ``/metrics`` over one pipeline."""

from __future__ import annotations

import contextlib
import functools
import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from localspec.constrain.grammar import Grammar, reply_grammar
from localspec.errors import GrammarError, LocalspecError, MessageError
from localspec.llama import rpc
from localspec.pipeline.chat_turns import chat_messages
from localspec.pipeline.tool_calls import ToolUse, tool_use
from localspec.pipeline.tool_schema import ToolCallError
from localspec.serve.endpoint import Endpoint
from localspec.serve.exposure import is_loopback
from localspec.serve.metrics import Metrics, generation_endpoint, prometheus_text
from localspec.serve.middleware import InternalErrors, LoopbackHosts
from localspec.serve.options import ServeOptions
from localspec.serve.schemas import (
    APIError,
    ChatRequest,
    CommonRequest,
    CompletionRequest,
    from_localspec,
    read_body,
    refuse_unsupported,
    validate_request,
)
from localspec.serve.worker import Worker

if TYPE_CHECKING:
    from localspec.pipeline.api import Pipeline

R = TypeVar("R", bound=CommonRequest)


class _Checked(Protocol):
    """A generation request authorized, read and checked against ``schema`` (``create_app``'s ``checked``)."""

    async def __call__(self, request: Request, schema: type[R]) -> R: ...


def create_app(pipe: Pipeline, opts: ServeOptions | None = None) -> FastAPI:
    """The ASGI app: OpenAI routes, ``/health`` and ``/metrics`` over ``pipe``. The worker thread starts
    and stops with the app's lifespan."""
    opts = opts or ServeOptions()
    metrics = Metrics()
    worker = Worker(pipe, metrics, max_queue=opts.max_queue)
    ep = Endpoint(pipe, opts, worker, metrics)

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
        app.add_middleware(LoopbackHosts, names=names)
    _answer_errors_as_openai(app, metrics)
    app.add_middleware(InternalErrors)

    def authorize(request: Request) -> None:
        _authorize(request, opts.api_key)

    async def checked(request: Request, schema: type[R]) -> R:
        """A generation request authorized, read and checked: a model served here, nothing unsupported."""
        authorize(request)
        req: R = validate_request(schema, await read_body(request, opts.max_body_bytes))
        ep.check_model(req.model)
        refuse_unsupported(req)
        return req

    _status_routes(app, ep, authorize)
    _generation_routes(app, pipe, ep, checked)
    return app


def _status_routes(app: FastAPI, ep: Endpoint, authorize: Callable[[Request], None]) -> None:
    """``/health``, ``/metrics`` and the model list."""
    worker, metrics, pipe = ep.worker, ep.metrics, ep.pipe

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {
            "status": "ok",
            "model": ep.model_id,
            "queue": worker.waiting,
            "busy": worker.busy,
            "slots": worker.slots,
            "slots_busy": len(worker.slot_stats()),
        }
        reason = backend_lost(worker)
        if reason is None:
            return JSONResponse(body)
        return JSONResponse({**body, "status": "unavailable", "reason": reason}, status_code=503)

    @app.get("/metrics")
    async def prometheus(request: Request) -> PlainTextResponse:
        authorize(request)
        return PlainTextResponse(
            prometheus_text(metrics, worker, ep.model_id),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        return {"object": "list", "data": [_model_entry(pipe, name) for name in ep.names]}

    @app.get("/v1/models/{name:path}")
    async def model(request: Request, name: str) -> dict[str, Any]:
        authorize(request)
        ep.check_model(name)
        return _model_entry(pipe, name)


def _generation_routes(app: FastAPI, pipe: Pipeline, ep: Endpoint, checked: _Checked) -> None:
    """OpenAI's two generation routes: chat completions and completions."""

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        req = await checked(request, ChatRequest)
        messages, tools, grammar = _chat_parts(req, pipe.chat_template)
        format_chat = functools.partial(pipe.format_chat, tools=tools.tools)
        try:
            tokens, stops = await anyio.to_thread.run_sync(format_chat, messages)
        except LocalspecError as exc:
            raise from_localspec(exc) from None
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
        req = await checked(request, CompletionRequest)
        prompt = req.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise APIError(400, f"one prompt per request, got {len(prompt)}", param="prompt")
            prompt = prompt[0]
        tokens = await anyio.to_thread.run_sync(pipe.tokenize, prompt)
        if not tokens:
            raise APIError(400, "the prompt is empty", param="prompt")
        return await ep.run(request, req, tokens, ep.kwargs(req, len(tokens), []), "completions")


def backend_lost(worker: Worker) -> str | None:
    """Why the served model can no longer generate (an rpc-server it used was lost, and llama.cpp cannot
    reconnect within this process), with what to do; None while it can."""
    failure = rpc.failed()
    if failure is None and worker.lost is None:
        return None
    what = worker.lost or f"an RPC server of the model was lost ({failure})"
    return f"{what}; restart the rpc-server(s), then this server"


def _answer_errors_as_openai(app: FastAPI, metrics: Metrics) -> None:
    """Every refusal (an :class:`APIError`, an unknown path or method) answered as OpenAI's error JSON; a
    generation endpoint's 4xx counted as ``refused``."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        endpoint = generation_endpoint(request.url.path)
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
            msg += ": send a POST with a JSON body" if generation_endpoint(request.url.path) else ": use GET"
            return APIError(405, msg, code="method_not_allowed").response()
        return APIError(exc.status_code, str(exc.detail)).response()


def _authorize(request: Request, api_key: str | None) -> None:
    """Nothing when the server has no key or the request bears it; else a 401."""
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    given = token.strip().encode() if scheme.lower() == "bearer" else b""
    if not hmac.compare_digest(given, api_key.encode()):
        raise APIError(
            401,
            "missing or wrong API key: send the server's key as 'Authorization: Bearer KEY'"
            if given
            else "this server needs an API key: send 'Authorization: Bearer KEY'",
            type="authentication_error",
            code="invalid_api_key",
        )


def _model_entry(pipe: Pipeline, name: str) -> dict[str, Any]:
    """A model as both model endpoints describe it; ``created`` is the target file's time."""
    path = pipe.info.target_path
    created = int(path.stat().st_mtime) if path.exists() else 0
    return {"id": name, "object": "model", "created": created, "owned_by": "localspec"}


def _chat_parts(
    req: ChatRequest, template: str | None
) -> tuple[list[dict[str, Any]], ToolUse, Grammar | None]:
    """A chat request's messages, tools and ``response_format`` grammar, checked: a 400 naming the field."""
    try:
        messages = chat_messages(req.messages)
        tools = tool_use(req.tools, req.tool_choice, template, parallel=req.parallel_tool_calls is not False)
        grammar = reply_grammar(req.response_format, reads_calls=tools.read_calls)
    except (ToolCallError, GrammarError, MessageError) as exc:
        message = exc.message + (f"; {exc.hint}" if exc.hint else "")
        code = "unsupported_parameter" if getattr(exc, "unsupported", False) else None
        raise APIError(400, message, param=exc.param, code=code) from None
    return messages, tools, grammar
