"""Tool calls in chat: the requests' ``tools`` checked, the model's calls read back out of its text.

localspec reads one tool-call format, the one the Qwen2.5/Qwen3 and Hermes chat templates teach their
models: each call is a JSON object ``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and
``</tool_call>``. A model speaks it when its chat template renders ``tools`` and names that tag
(:func:`template_format`); for any other template a request with tools is refused, never answered with
calls left in the text. The template renders the tools and the earlier turns (assistant ``tool_calls``,
``tool`` results) itself, so a prompt is what the model was trained on.

A call is written under a grammar (:func:`call_grammar`: the tag, one of the declared functions' names
and arguments matching that function's ``parameters`` schema, the closing tag): from the model's
``<tool_call>`` token on with ``tool_choice`` ``"auto"`` (the text before it is free), from the reply's
first token with ``"required"`` or a named function. So a call the model starts is always one the caller
can run, and everything is still the target's own choice among what the grammar allows
(:mod:`localspec.constrain.grammar`). ``"none"`` renders no tools. What a small model writes instead of the
tag (a
whole reply that is one JSON call, bare or fenced) is read too; other text stays text.

Nothing here touches a model: :func:`split_calls` reads a whole reply, :class:`CallSplitter` a streamed one
(its calls' names and arguments as they are written), both with the one rule of :class:`_CallReader`;
:meth:`ToolUse.responses` gives a stream's tokens as a chat client shows them (:class:`ChatResponse`: what
``Pipeline.chat_stream`` yields and the server streams).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from localspec.constrain.grammar import MAX_GRAMMAR_CHARS, Grammar, check_schema
from localspec.decoding.engine import TokenResponse
from localspec.errors import GrammarError, LocalspecError, MessageError
from localspec.settings import UTF8_HINT, utf8_problem

OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: The one format read (see the module docstring); a template's tool support is recognised by its tag.
HERMES = "hermes"
#: Bounds on what a request may declare (each tool's schema is rendered into every prompt).
MAX_TOOLS = 128
MAX_NAME_CHARS = 64
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # what OpenAI allows in a function name (dots too)
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_FENCED = re.compile(r"```(?:json)?\s*(\{.*\})\s*```|(\{.*\})", re.DOTALL)  # fenced, or bare
#: The start of a call as the <tool_call> format writes it, up to its arguments' opening brace: from there
#: the call is started, and its arguments are read (and streamed) as the model writes them.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.\-]{1,64})"\s*,\s*"arguments"\s*:\s*')
_HEAD_MAX = 256  # a block's start longer than this without matching _HEAD is read whole when it ends


class ToolCallError(LocalspecError, ValueError):
    """A request's ``tools``, ``tool_choice`` or earlier ``tool_calls`` that cannot be used; ``param`` names
    the field, ``unsupported`` says the value is fine but this model cannot do it."""

    def __init__(
        self, message: str, *, param: str, hint: str | None = None, unsupported: bool = False
    ) -> None:
        super().__init__(message, hint=hint)
        self.param = param
        self.unsupported = unsupported


@dataclass(frozen=True)
class ToolUse:
    """What a chat request's tools mean for its prompt and its reply (:func:`tool_use` makes one)."""

    tools: list[dict[str, Any]] | None = None  # for the chat template; None: the model is not shown tools
    grammar: Grammar | None = None  # what a call must look like (lazy for "auto", see call_grammar)
    read_calls: bool = False  # whether calls are read out of the reply
    parallel: bool = True  # False: the first call only
    names: tuple[str, ...] = ()  # the declared functions

    def split(self, reply: str) -> tuple[str, list[dict[str, Any]]]:
        """(the reply's text outside the calls, the calls) for the model's ``reply`` (without the prefix);
        the reply as it is, and no calls, when calls are not read."""
        if not self.read_calls:
            return reply, []
        text, calls = split_calls(reply, self.names)
        return text, calls if self.parallel else calls[:1]

    def splitter(self) -> CallSplitter | None:
        """A :class:`CallSplitter` for a streamed reply; None when calls are not read (the text streams as
        it is)."""
        if not self.read_calls:
            return None
        return CallSplitter(self.names, parallel=self.parallel)

    def responses(self, stream: Iterable[TokenResponse]) -> Iterator[ChatResponse]:
        """``stream``'s tokens with their chat ``content`` and ``tool_calls`` entries (see
        :class:`ChatResponse`); the last token (the one with a ``finish_reason``) also carries what was
        held back until the reply ended."""
        splitter = self.splitter()
        for r in stream:
            content, calls = r.text, []
            if splitter is not None:
                content = splitter.feed(r.text)
                calls = splitter.take_deltas()  # a call's name, then its arguments as they come
                if r.finish_reason is not None:
                    rest, _ = splitter.finish()
                    content += rest
                    calls += splitter.take_deltas()  # what completes the calls: the rest, or calls read whole
            yield ChatResponse(**{f: getattr(r, f) for f in _TOKEN_FIELDS}, content=content, tool_calls=calls)


@dataclass
class ChatResponse(TokenResponse):
    """One token of a chat reply, with what a chat client shows of it (``Pipeline.chat_stream`` yields these).

    ``text`` is the token's text as the model wrote it. ``content`` is the part of the reply's text
    outside tool calls that can be shown now: with ``tools``, what may start a ``<tool_call>`` (and
    trailing whitespace) is held back until it is known, and a call's markup never shows; without tools it
    is ``text``. ``tool_calls`` holds OpenAI's streamed ``delta.tool_calls`` entries read at this token:
    a call's ``index``, ``id``, ``type`` and ``function.name`` as soon as its name is written, then pieces
    of its ``function.arguments`` (put them together by ``index``). A stream's contents add up to the
    text outside the calls that :meth:`ToolUse.split` reads from the whole reply, and its entries to the
    same calls (each reading draws its own ids).
    """

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


_TOKEN_FIELDS = tuple(f.name for f in fields(TokenResponse))


#: A plain chat: no tools shown, the reply's text as it is.
NO_TOOLS = ToolUse()


def tool_use(tools: Any, tool_choice: Any, template: str | None, *, parallel: bool = True) -> ToolUse:
    """The request's ``tools`` and ``tool_choice`` (OpenAI's shapes) checked against each other and against
    the model's chat ``template``; raises :class:`ToolCallError` naming the field. No tools (None or an
    empty list, which clients without tools send) or ``tool_choice="none"``: a plain chat."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise ToolCallError("tool_choice needs tools", param="tool_choice")
        return NO_TOOLS
    checked = check_tools(tools)
    choice = check_choice(tool_choice, checked)
    if choice == "none":
        return NO_TOOLS  # the model is not told of the tools, so it answers in text
    if template_format(template) is None:
        raise ToolCallError(
            "tools: this model's chat template has no tool-call format localspec reads (it reads the "
            "<tool_call> JSON of Qwen2.5, Qwen3 and Hermes models)",
            param="tools",
            hint="send the request without tools, or use such a model",
            unsupported=True,
        )
    names = tuple(t["function"]["name"] for t in checked)
    only = choice.removeprefix("function:") if choice and choice.startswith("function:") else None
    grammar = call_grammar(checked, only=only, parallel=parallel, lazy=choice == "auto")
    return ToolUse(checked, grammar, True, parallel, names)


def template_format(template: str | None) -> str | None:
    """The tool-call format a chat template teaches (:data:`HERMES`), or None when it teaches none that
    localspec reads (no ``tools`` in the template, or another format such as Llama 3's or Mistral's)."""
    if template and "tools" in template and OPEN in template:
        return HERMES
    return None


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """``tools`` as the chat template takes them (OpenAI's shape: ``{"type": "function", "function":
    {"name", "description", "parameters"}}``); raises :class:`ToolCallError` naming the first bad field."""
    if not isinstance(tools, list) or not tools:
        raise ToolCallError("tools must be a non-empty list of functions", param="tools")
    if len(tools) > MAX_TOOLS:
        raise ToolCallError(f"at most {MAX_TOOLS} tools, got {len(tools)}", param="tools")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise ToolCallError(f'{where} must be {{"type": "function", "function": {{...}}}}', param=where)
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise ToolCallError(f"{where}.function must be an object with a name", param=f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolCallError(
                f"{where}.function.name must be 1-{MAX_NAME_CHARS} letters, digits, '_', '-' or '.', got "
                f"{name!r}",
                param=f"{where}.function.name",
            )
        if name in seen:
            raise ToolCallError(f"{where}: a second function named {name!r}", param=f"{where}.function.name")
        seen.add(name)
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise ToolCallError(
                f"{where}.function.description must be a string", param=f"{where}.function.description"
            )
        parameters = fn.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ToolCallError(
                f"{where}.function.parameters must be a JSON Schema object",
                param=f"{where}.function.parameters",
            )
        clean: dict[str, Any] = {"name": name}
        if description is not None:
            clean["description"] = description
        clean["parameters"] = (
            dict(parameters) if parameters is not None else {"type": "object", "properties": {}}
        )
        out.append({"type": "function", "function": clean})
    return out


def check_choice(choice: Any, tools: list[dict[str, Any]]) -> str | None:
    """``tool_choice`` as ``"auto"``, ``"none"``, ``"required"`` or the one function's name it names."""
    if choice is None or choice == "auto":
        return "auto"
    if choice in ("none", "required"):
        return str(choice)
    if (
        isinstance(choice, Mapping)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), Mapping)
    ):
        name = choice["function"].get("name")
        names = [t["function"]["name"] for t in tools]
        if name not in names:
            raise ToolCallError(
                f"tool_choice names the function {name!r}, which is not in tools",
                param="tool_choice",
                hint="name one of " + ", ".join(map(repr, names[:8])),
            )
        return f"function:{name}"
    raise ToolCallError(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
        param="tool_choice",
    )


def call_grammar(
    tools: list[dict[str, Any]], *, only: str | None = None, parallel: bool = True, lazy: bool = False
) -> Grammar:
    """The grammar of a reply's calls: ``<tool_call>``, a newline, ``{"name": NAME, "arguments": ARGS}``
    with ARGS matching that function's ``parameters`` (one of ``tools``, or ``only`` that one), a newline,
    ``</tool_call>``; more calls after it when ``parallel``, then the end. ``lazy``: free text until the
    model's ``<tool_call>`` token (``tool_choice`` auto). ``tools`` come checked (:func:`check_tools`).

    Each function's schema keeps its own ``$defs``: they move under one root, renamed per function, and
    its references with them, so two functions' definitions of one name cannot meet."""
    defs: dict[str, Any] = {}
    alternatives = []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        if only is not None and fn["name"] != only:
            continue
        key = f"f{i}"
        where = f"tools[{i}].function.parameters"
        try:
            check_schema(fn["parameters"], where)  # bounded before anything walks it
        except GrammarError as exc:
            raise ToolCallError(exc.message, param=where, hint=exc.hint) from None
        params = _rebased(fn["parameters"], key, defs)
        defs[key] = params
        alternatives.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, "arguments": {"$ref": f"#/$defs/{key}"}},
                "required": ["name", "arguments"],
            }
        )
    schema: dict[str, Any] = alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}
    schema = {**schema, "$defs": defs}
    try:
        call = Grammar.json_schema(schema, what="tools", max_chars=MAX_GRAMMAR_CHARS)
    except GrammarError as exc:
        raise ToolCallError(
            "tools: a function's parameters cannot be turned into a grammar for its calls: " + exc.message,
            param="tools",
            hint=exc.hint,
        ) from None
    one = f'"{OPEN}\\n" root "\\n{CLOSE}"'
    rule = f"localspec-calls ::= {one}" + (f' ("\\n" {one})*' if parallel else "") + "\n"
    return Grammar(call.text + rule, "localspec-calls", "tools", trigger=OPEN if lazy else "")


def _rebased(schema: Any, key: str, defs: dict[str, Any]) -> Any:
    """``schema`` with its ``$defs`` (or ``definitions``) moved into ``defs`` as ``KEY-NAME`` and every
    local reference (``#``, ``#/$defs/NAME``) pointing there."""
    if isinstance(schema, Mapping):
        for section in ("$defs", "definitions"):
            inner = schema.get(section)
            if isinstance(inner, Mapping):
                for name, sub in inner.items():
                    defs[f"{key}-{name}"] = _rebased(sub, key, defs)
        out = {}
        for k, v in schema.items():
            if k in ("$defs", "definitions"):
                continue
            if k == "$ref" and isinstance(v, str):
                if v == "#":
                    v = f"#/$defs/{key}"
                else:
                    for section in ("#/$defs/", "#/definitions/"):
                        if v.startswith(section):
                            v = f"#/$defs/{key}-" + v.removeprefix(section)
            out[k] = _rebased(v, key, defs)
        return out
    if isinstance(schema, list):
        return [_rebased(v, key, defs) for v in schema]
    return schema


def template_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An earlier assistant turn's ``tool_calls`` (OpenAI's shape, ``arguments`` a JSON string) as chat
    templates render them: ``arguments`` an object, as Hugging Face's templates expect."""
    if not isinstance(calls, list):
        raise ToolCallError(f"{where} must be a list of tool calls", param=where)
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ToolCallError(
                f'{at} must be {{"type": "function", "function": {{"name": ..., "arguments": "..."}}}}',
                param=at,
            )
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError):  # (nested deeper than Python's JSON reader goes)
                raise ToolCallError(
                    f"{at}.function.arguments is not valid JSON (or nested too deeply)",
                    param=f"{at}.function.arguments",
                ) from None
        entry: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


#: The roles a chat turn may have (OpenAI's; ``developer`` is rendered as ``system``).
ROLES = ("system", "developer", "user", "assistant", "tool")
_MESSAGE_HINT = 'give a list of {"role": "user", "content": "..."} dicts, as OpenAI\'s chat API takes them'


def chat_messages(raw: Any) -> list[dict[str, Any]]:
    """Chat messages as the chat template takes them, checked: a role of :data:`ROLES` and text content (a
    string, ``None`` or OpenAI's list of text parts) per turn, and the tool calls of an assistant turn
    (arguments as objects, :func:`template_messages`) or the call a tool result answers. A template given
    anything else fails inside Jinja, or silently drops the turn (Qwen's renders no unknown role), so
    everything else is a :class:`MessageError` naming the field."""
    if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, (list, tuple)):
        raise MessageError(
            f"messages must be a list of turns, got {type(raw).__name__}",
            param="messages",
            hint=_MESSAGE_HINT,
        )
    if not raw:
        raise MessageError(
            "messages is empty: there is nothing to reply to", param="messages", hint=_MESSAGE_HINT
        )
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping):
            raise MessageError(
                f"messages[{i}] must be a dict with role and content, got {type(m).__name__}",
                param=f"messages[{i}]",
                hint=_MESSAGE_HINT,
            )
        role = m.get("role")
        if role not in ROLES:
            raise MessageError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                param=f"messages[{i}].role",
            )
        content = m.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not (
                    isinstance(part, Mapping)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    raise MessageError(
                        f"messages[{i}].content[{j}]: only text parts are supported "
                        '({"type": "text", "text": "..."})',
                        param=f"messages[{i}].content",
                    )
                parts.append(part["text"])
            text = "".join(parts)
        else:
            raise MessageError(
                f"messages[{i}].content must be a string or a list of text parts, "
                f"got {type(content).__name__}",
                param=f"messages[{i}].content",
            )
        if problem := utf8_problem(text):
            raise MessageError(
                f"messages[{i}].content {problem}", param=f"messages[{i}].content", hint=UTF8_HINT
            )
        message: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": text}
        if role == "assistant" and m.get("tool_calls"):
            message["tool_calls"] = m["tool_calls"]
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            message["tool_call_id"] = m["tool_call_id"]
        out.append(message)
    return template_messages(out)


def template_messages(messages: list[dict]) -> list[dict]:
    """``messages`` with each assistant turn's ``tool_calls`` as templates render them
    (:func:`template_calls`); the rest as it is."""
    return [
        {**m, "tool_calls": template_calls(m["tool_calls"], f"messages[{i}].tool_calls")}
        if isinstance(m, Mapping) and m.get("role") == "assistant" and m.get("tool_calls")
        else m
        for i, m in enumerate(messages)
    ]


# Reading calls back -----------------------------------------------------------------------------------
def _call(body: str) -> dict[str, Any] | None:
    """One ``<tool_call>`` body as an OpenAI tool call, or None when it is not ``{"name", "arguments"}``."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": obj["name"], "arguments": text},
    }


def _fenced_call(text: str, names: Collection[str]) -> dict[str, Any] | None:
    """The call a whole reply makes when it is one JSON object ``{"name": N, "arguments": {...}}``, bare or
    in a fenced block, naming a declared function (what small models write instead of the tag), else
    None."""
    m = _FENCED.fullmatch(text)
    if m is None:
        return None
    body = m.group(1) or m.group(2)
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or set(obj) != {"name", "arguments"} or obj["name"] not in names:
        return None
    return _call(body)


def may_start_fenced_call(text: str) -> bool:
    """Whether ``text`` (a reply's start, whitespace stripped) is, or may grow into, the start of a call
    written without the tag (:func:`_fenced_call`): a stream holds such a reply back until it ends."""
    want = "```"
    if not text:
        return True
    if text.startswith("{"):
        rest = text
    elif len(text) <= len(want):
        return want.startswith(text)
    elif not text.startswith(want):
        return False
    else:
        rest = text[len(want) :]
        if "json".startswith(rest):
            return True
        rest = rest.removeprefix("json")
    for literal in ("{", '"name"', ":"):
        rest = rest.lstrip()
        if not rest:
            return True
        if len(rest) < len(literal):
            return literal.startswith(rest)
        if not rest.startswith(literal):
            return False
        rest = rest[len(literal) :]
    return True


def split_calls(text: str, names: Collection[str] = ()) -> tuple[str, list[dict[str, Any]]]:
    """A reply as (its text outside the calls, stripped; the calls in OpenAI's shape), read by
    :class:`_CallReader` (the rule is there; a stream reads with the same one). With ``names`` (the declared
    functions), a reply that is nothing but one JSON call of one of them, bare or fenced, is that call."""
    reader = _CallReader()
    reader.feed(text)
    return _read(reader, text, names)


def _read(reader: _CallReader, text: str, names: Collection[str]) -> tuple[str, list[dict[str, Any]]]:
    """What :func:`split_calls` returns, from ``reader`` fed all of ``text``."""
    reader.end()
    calls = [c.as_openai() for c in reader.calls]
    if not calls and names:
        fenced = _fenced_call(text.strip(), names)
        if fenced is not None:
            return "", [fenced]
    return "".join(reader.text).strip(), calls


def _tag_start(text: str) -> int:
    """How many of ``text``'s last characters may be the start of ``<tool_call>``."""
    top = min(len(OPEN) - 1, len(text))
    return next((k for k in range(top, 0, -1) if OPEN.startswith(text[-k:])), 0)


@dataclass
class _Call:
    index: int  # its place among the reply's calls (a stream's tool_calls index)
    id: str
    name: str
    arguments: str  # as written (a started call), or as _call gives it (a block read whole)

    def as_openai(self) -> dict[str, Any]:
        fn = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": fn}


@dataclass
class _CallReader:
    """The one rule a reply's ``<tool_call>`` blocks are read by, whole or as they stream in.

    A block whose start is ``{"name": NAME, "arguments": {`` (what the format teaches, and what the calls'
    grammar makes a model write) is a *started* call from that brace on: its arguments are the JSON object
    that follows, as written, read up to its closing brace (strings and escapes respected, so a
    ``</tool_call>`` inside an argument string is text of the argument) or, cut short, up to the end of the
    reply or a ``<`` outside any string; whatever else the block holds after them is ignored. Any other
    block is read whole when its closing tag (or the reply) ends it: a call if it is one JSON object
    ``{"name", "arguments"}`` (keys in any order), else it stays text. So a call that a stream has begun to
    send is a call of the whole reply too, with the same arguments.

    :attr:`events` collects ``("start", call)`` and ``("arguments", index, text)`` for a stream; the work per
    fed piece is bounded by the piece (and by :data:`_HEAD_MAX`), not by the reply.
    """

    text: list[str] = field(default_factory=list)  # the reply outside the calls
    calls: list[_Call] = field(default_factory=list)
    events: list[tuple] = field(default_factory=list)
    _mode: str = "text"  # text | head | args | tail
    _buf: str = ""  # text: what may start OPEN; head: the block so far; tail: what may end with CLOSE
    _block: list[str] = field(default_factory=list)  # a block read whole: its text since OPEN
    _depth: int = 0
    _in_string: bool = False
    _escaped: bool = False

    def feed(self, piece: str) -> None:
        i, n = 0, len(piece)
        while i < n:
            mode = self._mode
            if mode == "text":
                buf = self._buf + piece[i:]
                at = buf.find(OPEN)
                if at < 0:
                    keep = _tag_start(buf)
                    self.text.append(buf[: len(buf) - keep])
                    self._buf = buf[len(buf) - keep :]
                    return
                self.text.append(buf[:at])
                consumed = at + len(OPEN) - len(self._buf)  # of this piece
                self._buf, self._mode, self._block = "", "head", [OPEN]
                i += consumed
            elif mode == "head":
                ch = piece[i]
                i += 1
                self._buf += ch
                self._block.append(ch)
                if ch == "{" and (m := _HEAD.fullmatch(self._buf[:-1])):
                    call = _Call(len(self.calls), "call_" + uuid.uuid4().hex[:24], m.group(1), "{")
                    self.calls.append(call)
                    self.events.append(("start", call))
                    self.events.append(("arguments", len(self.calls) - 1, "{"))
                    self._mode, self._depth, self._in_string, self._escaped = "args", 1, False, False
                    self._block = []  # a started call: never read whole
                elif self._buf.endswith(CLOSE):
                    self._close_whole()
                elif len(self._buf) > _HEAD_MAX:
                    self._mode, self._buf = "tail", self._buf[-len(CLOSE) :]
            elif mode == "args":
                j = i
                while j < n:
                    ch = piece[j]
                    if self._in_string:
                        if self._escaped:
                            self._escaped = False
                        elif ch == "\\":
                            self._escaped = True
                        elif ch == '"':
                            self._in_string = False
                    elif ch == '"':
                        self._in_string = True
                    elif ch in "{[":
                        self._depth += 1
                    elif ch in "}]":
                        self._depth -= 1
                        if self._depth == 0:
                            j += 1
                            self._mode, self._buf = "tail", ""
                            break
                    elif ch == "<":  # not JSON: the arguments were cut short (a tag follows)
                        self._mode, self._buf = "tail", ""
                        break
                    j += 1
                if j > i:
                    self.calls[-1].arguments += piece[i:j]
                    self.events.append(("arguments", len(self.calls) - 1, piece[i:j]))
                i = j
            else:  # tail: the rest of a block, up to its closing tag
                ch = piece[i]
                i += 1
                if self._block:
                    self._block.append(ch)
                self._buf = (self._buf + ch)[-len(CLOSE) :]
                if self._buf == CLOSE:
                    if self._block:
                        self._close_whole()
                    else:
                        self._mode, self._buf = "text", ""

    def _close_whole(self) -> None:
        """A block read whole ends (its closing tag, or the reply): a call, or text as it was."""
        block = "".join(self._block)
        body = block[len(OPEN) :].removesuffix(CLOSE).strip()
        call = _call(body)
        if call is None:
            self.text.append(block)
        else:
            fn = call["function"]
            self.calls.append(_Call(len(self.calls), call["id"], fn["name"], fn["arguments"]))
            self.events.append(("whole", self.calls[-1]))
        self._mode, self._buf, self._block = "text", "", []

    def end(self) -> None:
        """The reply is over."""
        if self._mode == "text":
            self.text.append(self._buf)
        elif self._block:  # a block read whole that never closed: a call if its body is one
            self._close_whole()
        self._mode, self._buf = "text", ""


@dataclass
class CallSplitter:
    """A streamed reply, fed piece by piece. :meth:`feed` returns the text that can go to the client now:
    the reply's text stripped as :func:`split_calls` strips it, with trailing whitespace and what may be
    the start of ``<tool_call>`` held back; from the first ``<tool_call>`` on the text is held.
    :meth:`take_deltas` returns the calls as OpenAI's streamed ``tool_calls`` entries: a started call's
    name as soon as it is written, then its arguments as they come (:class:`_CallReader`), a call read
    whole when its block ends. :meth:`finish` returns the rest: the pieces sent add up to exactly
    :func:`split_calls`' text, and the entries to its calls (ids included)."""

    names: Collection[str] = ()  # the declared functions (see split_calls)
    parallel: bool = True  # False: the first call only
    _pieces: list[str] = field(default_factory=list)  # the whole reply so far, joined only at the end
    _pending: str = ""  # what came after the text sent so far and is held (a few characters, usually)
    _sent: int = 0  # characters of the stripped text returned so far
    _in_call: bool = False
    _reader: _CallReader = field(default_factory=_CallReader)
    _fenced: dict[str, Any] | None = None

    def feed(self, piece: str) -> str:
        """The text that can go out now; the work per piece is bounded by what is held, not the reply."""
        self._pieces.append(piece)
        self._reader.feed(piece)
        if self._in_call:
            return ""
        pending = self._pending + piece
        at = pending.find(OPEN)
        if at >= 0:
            self._in_call = True
            safe = pending[:at]
        else:
            safe = pending[: len(pending) - _tag_start(pending)]
        drop = 0
        if not self._sent:  # nothing sent yet: the reply's leading whitespace goes, and it may be a call
            drop = len(safe) - len(safe.lstrip())
            if self.names and may_start_fenced_call(pending.lstrip()[:64]):
                self._pending = pending
                return ""  # held until the reply ends, or until its start rules a call out
        out = safe[drop:].rstrip()
        if out:
            self._sent += len(out)
            pending = pending[drop + len(out) :]
        self._pending = pending
        return out

    def take_deltas(self) -> list[dict[str, Any]]:
        """OpenAI ``delta.tool_calls`` entries for what was read since the last call (none: [])."""
        out: list[dict[str, Any]] = []
        for event in self._reader.events:
            if event[0] == "arguments":
                _, i, text = event
                if out and out[-1]["index"] == i:
                    out[-1]["function"]["arguments"] += text  # one entry per call and take
                else:
                    out.append({"index": i, "function": {"arguments": text}})
                continue
            call = event[1]
            entry = {"index": call.index, **call.as_openai()}
            if event[0] == "start":
                entry["function"] = {"name": call.name, "arguments": ""}
            out.append(entry)
        self._reader.events.clear()
        if self._fenced is not None:
            out.append({"index": 0, **self._fenced})
            self._fenced = None
        return [e for e in out if self.parallel or e["index"] == 0]

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(the text not sent yet, the calls); :meth:`take_deltas` then gives the entries that complete
        them."""
        content, calls = _read(self._reader, "".join(self._pieces), self.names)
        if calls and not self._reader.calls:  # the whole reply is one call written without the tag
            self._fenced = calls[0]
        return content[self._sent :], calls if self.parallel else calls[:1]
