"""What a request may say, and how the server says no: the two endpoints' request bodies read and checked
(pydantic, strict), parameters localspec cannot honour refused, and every error answered as OpenAI's JSON
``{"error": {"message", "type", "param", "code"}}`` by :class:`APIError`, built here and nowhere else."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from localspec.errors import LocalspecError

MAX_STOP_STRINGS = 16


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


def from_localspec(exc: LocalspecError, status: int = 400, code: str | None = None) -> APIError:
    """``exc`` as the client's error: its message and hint; a 5xx is the server's state (``server_error``),
    anything else the request's (``invalid_request_error``)."""
    message = exc.message + (f" ({exc.hint})" if exc.hint else "")
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return APIError(status, message, type=kind, param=getattr(exc, "param", None), code=code)


# ------------------------------------------------------------------------------------------- requests
class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class CommonRequest(BaseModel):
    """Fields both endpoints share. Unknown fields are ignored (clients send many); fields localspec
    cannot honour are refused when set to anything but their neutral value (:func:`refuse_unsupported`)."""

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


class ChatRequest(CommonRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None


class CompletionRequest(CommonRequest):
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


def validate_request(model: type[BaseModel], body: bytes) -> Any:
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


def refuse_unsupported(req: CommonRequest) -> None:
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


async def read_body(request: Request, limit: int) -> bytes:
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
