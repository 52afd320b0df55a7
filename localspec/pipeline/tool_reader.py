"""The model's tool calls read back out of its reply: whole (:func:`split_calls`) or as it streams
(:class:`CallSplitter`, its calls' names and arguments as they are written), both by the one rule of
:class:`_CallReader`. A reply that is nothing but one JSON call, bare or fenced (what a small model writes
instead of the tag), is read too; other text stays text.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from localspec.pipeline.tool_schema import CLOSE, OPEN

_FENCED = re.compile(r"```(?:json)?\s*(\{.*\})\s*```|(\{.*\})", re.DOTALL)  # fenced, or bare
#: The start of a call as the <tool_call> format writes it, up to its arguments' opening brace: from there
#: the call is started, and its arguments are read (and streamed) as the model writes them.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.\-]{1,64})"\s*,\s*"arguments"\s*:\s*')
_HEAD_MAX = 256  # a block's start longer than this without matching _HEAD is read whole when it ends


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
        i = 0
        while i < len(piece):
            if self._mode == "text":
                i = self._feed_text(piece, i)
            elif self._mode == "head":
                self._feed_head(piece[i])
                i += 1
            elif self._mode == "args":
                i = self._feed_arguments(piece, i)
            else:
                self._feed_tail(piece[i])
                i += 1

    def _feed_text(self, piece: str, i: int) -> int:
        """Text outside the calls, up to a ``<tool_call>``; what may start one is held. Where it ends."""
        buf = self._buf + piece[i:]
        at = buf.find(OPEN)
        if at < 0:
            keep = _tag_start(buf)
            self.text.append(buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return len(piece)
        self.text.append(buf[:at])
        consumed = at + len(OPEN) - len(self._buf)  # of this piece
        self._buf, self._mode, self._block = "", "head", [OPEN]
        return i + consumed

    def _feed_head(self, ch: str) -> None:
        """A block's start: a started call once it reads ``{"name": NAME, "arguments": {``."""
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

    def _feed_arguments(self, piece: str, i: int) -> int:
        """A started call's arguments, up to the brace that closes them (or a ``<`` that cuts them short).
        Where they end in ``piece``."""
        j = i
        while j < len(piece):
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
        return j

    def _feed_tail(self, ch: str) -> None:
        """The rest of a block, up to its closing tag."""
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
