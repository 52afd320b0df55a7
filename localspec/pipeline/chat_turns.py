"""A chat's messages checked before its template renders them: roles, text content, and the tool calls of
earlier assistant turns in the shape templates take (arguments as objects)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from localspec.errors import MessageError
from localspec.pipeline.tool_schema import ToolCallError
from localspec.settings import UTF8_HINT, utf8_problem


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
