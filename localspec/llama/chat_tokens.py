"""Chat prompts as tokens where only the chat template's own text can become control tokens.

Tokenizing a whole rendered chat prompt with ``special=True`` turns ``<|im_start|>system`` typed inside a
message into the real control token: the sender forges a turn. Here the template is rendered a second
time with every string the caller supplied (message content, names, tool-call text: every string but the
``role`` and ``type`` fields) replaced by a random sentinel. Cutting that rendering at the sentinels gives
the template's own text; putting the real strings back must give the real rendering exactly, otherwise
the cut is not trusted (:func:`chat_segments`).

:func:`tokenize_segments` then does what llama.cpp's tokenizer does with ``special=True`` (control tokens
cut out of the text longest first, LSTRIP/RSTRIP whitespace dropped, each stretch of text between them
tokenized on its own), except that control tokens are cut only from the template's text. The text between
two control tokens is still tokenized in one piece, across the template/message boundaries, so a prompt
whose messages hold no control-token text gets exactly the tokens it got before.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp

from localspec.errors import LocalspecError

# Fields whose value steers the template (``if message.role == 'user'``, ``part.type == 'text'``): kept.
_KEPT_FIELDS = frozenset({"role", "type"})
_SPACES = " \t\n\v\f\r"  # C isspace(), what llama.cpp strips next to LSTRIP/RSTRIP tokens

Segment = tuple[str, bool]  # (text, from the template itself)


@dataclass(frozen=True)
class Special:
    """A token llama.cpp cuts out of text before tokenizing it (control, user-defined or unknown)."""

    id: int
    text: str
    control: bool  # control or unknown: recognised only with special=True
    lstrip: bool
    rstrip: bool


class ChatTokenizer:
    """One model's special tokens and tokenizer, for :func:`tokenize_segments`."""

    def __init__(self, vocab: Any, plain: Callable[[str], list[int]]) -> None:
        """``vocab``: the llama.cpp vocabulary; ``plain``: text to tokens, ``special=False``, no BOS."""
        cut = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        cut |= llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        found = []
        for i in range(llama_cpp.llama_vocab_n_tokens(vocab)):
            attr = llama_cpp.llama_vocab_get_attr(vocab, i)
            if not attr & cut:
                continue
            try:
                text = llama_cpp.llama_vocab_get_text(vocab, i).decode("utf-8")
            except UnicodeDecodeError:  # cannot occur in text that is valid UTF-8
                continue
            if text:
                found.append(
                    Special(
                        i,
                        text,
                        bool(attr & control),
                        bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP),
                        bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP),
                    )
                )
        # llama.cpp tries the longest texts first
        self.specials: tuple[Special, ...] = tuple(sorted(found, key=lambda s: (-len(s.text.encode()), s.id)))
        self.control_texts: tuple[str, ...] = tuple(s.text for s in self.specials if s.control)
        self.plain = plain
        bos, eos = llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab)
        self.prefix = [bos] if llama_cpp.llama_vocab_get_add_bos(vocab) and bos >= 0 else []
        self.suffix = [eos] if llama_cpp.llama_vocab_get_add_eos(vocab) and eos >= 0 else []

    def tokenize(self, segments: Sequence[Segment], *, add_special: bool) -> list[int]:
        return tokenize_segments(segments, self, add_special=add_special)


def _cut(text: str, specials: Sequence[Special]) -> list[str | Special]:
    """``text`` with every special token cut out, longest first, as llama.cpp partitions it."""
    parts: list[str | Special] = [text] if text else []
    for sp in specials:
        out: list[str | Special] = []
        for part in parts:
            if not isinstance(part, str) or sp.text not in part:
                out.append(part)
                continue
            start = 0
            while (at := part.find(sp.text, start)) >= 0:
                if at > start:
                    out.append(part[start:at])
                out.append(sp)
                start = at + len(sp.text)
            if start < len(part):
                out.append(part[start:])
        parts = out
    return parts


def tokenize_segments(segments: Sequence[Segment], tok: ChatTokenizer, *, add_special: bool) -> list[int]:
    """Tokens of the joined segments; special tokens are recognised only inside template segments.

    With every segment from the template this is llama.cpp's ``tokenize(text, special=True)``; with none,
    ``special=False``.
    """
    items: list[str | Special] = []
    for text, trusted in segments:
        for item in _cut(text, tok.specials) if trusted else [text]:
            if isinstance(item, Special) or not items or not isinstance(items[-1], str):
                items.append(item)
            else:
                items[-1] += item  # one stretch of text across template and message
    for i, item in enumerate(items):
        if isinstance(item, Special):
            if item.lstrip and i > 0 and isinstance(items[i - 1], str):
                items[i - 1] = str(items[i - 1]).rstrip(_SPACES)
            if item.rstrip and i + 1 < len(items) and isinstance(items[i + 1], str):
                items[i + 1] = str(items[i + 1]).lstrip(_SPACES)
    out = list(tok.prefix) if add_special else []
    for item in items:
        if isinstance(item, Special):
            out.append(item.id)
        elif item:
            out.extend(tok.plain(item))
    if add_special:
        out.extend(tok.suffix)
    return out


def _structure(value: Any) -> list[str]:
    """The strings of ``value`` that :func:`_replace_strings` keeps: dict keys, ``role``/``type`` values."""
    out: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            out.append(str(k))
            if k in _KEPT_FIELDS and isinstance(v, str):
                out.append(v)
            else:
                out += _structure(v)
    elif isinstance(value, list | tuple):
        for v in value:
            out += _structure(v)
    return out


def _replace_strings(value: Any, replace: Callable[[str], str]) -> Any:
    """``value`` with every non-empty string replaced, except the values of the ``role``/``type`` fields."""
    if isinstance(value, str):
        return replace(value) if value else value
    if isinstance(value, Mapping):
        return {k: v if k in _KEPT_FIELDS else _replace_strings(v, replace) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_replace_strings(v, replace) for v in value]
    return value


def _split_at_sentinels(
    rendered: str, sentinel: re.Pattern[str], texts: list[str], expected: str
) -> list[Segment] | None:
    """``rendered`` cut at the sentinels, each replaced by its text; None unless that gives ``expected``."""
    segments: list[Segment] = []
    pos = 0
    for m in sentinel.finditer(rendered):
        index = int(m.group(1))
        if index >= len(texts):
            return None
        segments += [(rendered[pos : m.start()], True), (texts[index], False)]
        pos = m.end()
    segments.append((rendered[pos:], True))
    if "".join(text for text, _ in segments) != expected:
        return None
    return [s for s in segments if s[0]]


def chat_segments(
    prompt: str, render: Callable[[Any], str], messages: Any, control_texts: Sequence[str]
) -> list[Segment]:
    """``prompt`` (``render(messages)``) cut into the template's text (trusted) and the caller's strings.
    ``messages`` is what the caller gave the template: a list of messages, or a mapping of them and more
    (tools).

    0. The strings a template may read as structure and so are not replaced (dict keys, ``role`` and
       ``type`` values) must not hold control-token text: refused otherwise.
    1. Every caller string becomes a sentinel; the template's output around them is trusted.
    2. If the template changed a string (``| trim``, ``.strip()``), each string's leading and trailing
       whitespace is kept around its sentinel, so a trimming template trims it as it trims the real one.
    3. If the template still changes the strings (upper-casing, splitting reasoning out of a message), the
       messages cannot be told apart from the template: the prompt is tokenized as a whole (control tokens
       recognised) only when no caller string holds control-token text, in any letter case; otherwise the
       messages are refused.
    """
    _refuse_control_keys(_structure(messages), control_texts)
    nonce = secrets.token_hex(8)
    sentinel = re.compile(f"q{nonce}z(\\d+)q")

    def attempt(keep_spaces: bool) -> list[Segment] | None:
        texts: list[str] = []

        def replace(s: str) -> str:
            core = s.strip() if keep_spaces else s
            lead = s[: len(s) - len(s.lstrip())] if keep_spaces else ""
            trail = s[len(s.rstrip()) :] if keep_spaces and core else ""
            texts.append(core)
            return f"{lead}q{nonce}z{len(texts) - 1}q{trail}"

        marked = _replace_strings(messages, replace)
        if not texts:
            return [(prompt, True)]
        try:
            rendered = render(marked)
        except Exception:  # a template that checks the text itself (it accepted the real one)
            return None
        return _split_at_sentinels(rendered, sentinel, texts, prompt)

    for keep_spaces in (False, True):
        segments = attempt(keep_spaces)
        if segments is not None:
            return segments
    _refuse_control_text(messages, control_texts)
    return [(prompt, True)]


def _control_texts_in(strings: list[str], control_texts: Sequence[str]) -> list[str]:
    """The control tokens' texts that occur in ``strings``, in any letter case (first found first)."""
    folded = [(t, t.casefold()) for t in control_texts]
    found: list[str] = []
    for s in strings:
        low = s.casefold()
        found.extend(t for t, f in folded if f in low and t not in found)
    return found


def _refuse_control_keys(strings: list[str], control_texts: Sequence[str]) -> None:
    found = _control_texts_in(strings, control_texts)
    if found:
        raise LocalspecError(
            f"a field name or role/type value in the messages or tools holds the text of the model's control "
            f"token {found[0]!r}, which the chat template would turn into that token",
            hint="use plain names for fields, roles and types",
        )


def _refuse_control_text(messages: Any, control_texts: Sequence[str]) -> None:
    strings: list[str] = []

    def collect(s: str) -> str:
        strings.append(s)
        return s

    _replace_strings(messages, collect)
    found = _control_texts_in(strings, control_texts)
    if found:
        raise LocalspecError(
            f"a message contains the text of the model's control token {found[0]!r}, and this model's chat "
            "template rewrites message text, so it could not be kept from acting as that token",
            hint="remove control-token text (" + ", ".join(repr(t) for t in found[:3]) + ") from messages",
        )
