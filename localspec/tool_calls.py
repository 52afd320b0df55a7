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
(:mod:`localspec.grammar`). ``"none"`` renders no tools. What a small model writes instead of the tag (a
whole reply that is one JSON call, bare or fenced) is read too; other text stays text.

Nothing here touches a model: :class:`CallSplitter` is what the server's stream runs, :func:`split_calls`
what a whole reply is read with.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from localspec.errors import GrammarError, LocalspecError
from localspec.grammar import MAX_GRAMMAR_CHARS, Grammar, check_schema

OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: The one format read (see the module docstring); a template's tool support is recognised by its tag.
HERMES = "hermes"
#: Bounds on what a request may declare (each tool's schema is rendered into every prompt).
MAX_TOOLS = 128
MAX_NAME_CHARS = 64
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # what OpenAI allows in a function name (dots too)
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_FENCED = re.compile(r"```(?:json)?\s*(\{.*\})\s*```|(\{.*\})", re.DOTALL)  # fenced, or bare


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
        return CallSplitter(self.names)


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
    """A reply as (its text outside the calls, stripped; the calls in OpenAI's shape). A block that does
    not hold a well-formed call stays in the text, and so does an unclosed one unless its body is a
    whole call (a reply that ended right after the JSON). With ``names`` (the declared functions), a reply
    that is nothing but one JSON call of one of them, bare or fenced, is read as that call too."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        call = _call(m.group(1).strip())
        kept.append(text[pos : m.start()] if call else text[pos : m.end()])
        if call:
            calls.append(call)
        pos = m.end()
    rest = text[pos:]
    at = rest.find(OPEN)
    if at >= 0:
        call = _call(rest[at + len(OPEN) :].strip())
        if call:
            calls.append(call)
            rest = rest[:at]
    kept.append(rest)
    if not calls and names:
        fenced = _fenced_call(text.strip(), names)
        if fenced is not None:
            return "", [fenced]
    return "".join(kept).strip(), calls


@dataclass
class CallSplitter:
    """A streamed reply, fed piece by piece. :meth:`feed` returns the text that can go to the client now:
    the reply's text stripped as :func:`split_calls` strips it, with trailing whitespace and what may be
    the start of ``<tool_call>`` held back; from the first ``<tool_call>`` on everything is held.
    :meth:`finish` returns the rest, so the pieces sent add up to exactly :func:`split_calls`' text."""

    names: Collection[str] = ()  # the declared functions (see split_calls)
    _pieces: list[str] = field(default_factory=list)  # the whole reply so far, joined only at the end
    _pending: str = ""  # what came after the text sent so far and is held (a few characters, usually)
    _sent: int = 0  # characters of the stripped text returned so far
    _in_call: bool = False

    def feed(self, piece: str) -> str:
        """The text that can go out now; the work per piece is bounded by what is held, not the reply."""
        self._pieces.append(piece)
        if self._in_call:
            return ""
        pending = self._pending + piece
        at = pending.find(OPEN)
        if at >= 0:
            self._in_call = True
            safe = pending[:at]
        else:
            keep = next(
                (k for k in range(min(len(OPEN) - 1, len(pending)), 0, -1) if OPEN.startswith(pending[-k:])),
                0,
            )
            safe = pending[: len(pending) - keep]
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

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(the text not sent yet, the calls)."""
        content, calls = split_calls("".join(self._pieces), self.names)
        return content[self._sent :], calls
