"""A chat request's ``tools`` and ``tool_choice`` checked, and the grammar its calls are written under.

The format is the ``<tool_call>`` JSON of the Qwen2.5/Qwen3 and Hermes chat templates (:data:`HERMES`,
recognised in a template by its tag); :func:`call_grammar` spells a call of one of the declared functions,
its arguments matching that function's ``parameters`` schema.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from localspec.constrain.grammar import MAX_GRAMMAR_CHARS, Grammar, check_schema
from localspec.errors import GrammarError, LocalspecError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: The one format read (see the module docstring); a template's tool support is recognised by its tag.
HERMES = "hermes"
#: Bounds on what a request may declare (each tool's schema is rendered into every prompt).
MAX_TOOLS = 128
MAX_NAME_CHARS = 64
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # what OpenAI allows in a function name (dots too)


class ToolCallError(LocalspecError, ValueError):
    """A request's ``tools``, ``tool_choice`` or earlier ``tool_calls`` that cannot be used; ``param`` names
    the field, ``unsupported`` says the value is fine but this model cannot do it."""

    def __init__(
        self, message: str, *, param: str, hint: str | None = None, unsupported: bool = False
    ) -> None:
        super().__init__(message, hint=hint)
        self.param = param
        self.unsupported = unsupported


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
