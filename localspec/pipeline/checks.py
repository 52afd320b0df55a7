"""The arguments of a generation, checked before anything runs: errors with a hint, not llama.cpp's."""

from __future__ import annotations

import operator
from typing import Any

from localspec.constrain.grammar import Grammar
from localspec.errors import SettingsError
from localspec.settings import UTF8_HINT, utf8_problem


def checked_grammar_and_length(grammar: Any, max_tokens: Any) -> None:
    """A :class:`SettingsError` unless ``grammar`` is None or a :class:`Grammar` and ``max_tokens`` a whole
    number >= 1."""
    if grammar is not None and not isinstance(grammar, Grammar):
        raise SettingsError(
            f"grammar must be a localspec.Grammar, got {type(grammar).__name__}",
            hint="e.g. Grammar.json_object(), Grammar.json_schema({...}) or Grammar.gbnf(text)",
        )
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise SettingsError(f"max_tokens must be a whole number >= 1, got {max_tokens!r}", hint="e.g. 256")


def checked_stop(stop: Any) -> list[str] | None:
    """``stop`` as a list of strings: one string is one stop string, as in OpenAI's API (iterated, it
    would stop at each of its characters)."""
    if stop is None or isinstance(stop, str):
        return None if stop is None else [stop]
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise SettingsError(
        f"stop must be a string or a list of strings, got {stop!r:.60}", hint='e.g. stop=["\\n\\n"]'
    )


def checked_text(text: Any, what: str) -> str:
    """``text`` when it is a ``str`` llama.cpp's tokenizer takes (:func:`localspec.settings.utf8_problem`)."""
    if not isinstance(text, str):
        hint = "decode it first (text.decode('utf-8'))" if isinstance(text, bytes) else "pass a str"
        if isinstance(text, (list, tuple)):
            hint = "pass one str; for token ids use stream_tokens()"
        raise SettingsError(f"the {what} must be text (a str), got {type(text).__name__}", hint=hint)
    if problem := utf8_problem(text):
        raise SettingsError(f"the {what} {problem}", hint=UTF8_HINT)
    return text


def checked_tokens(tokens: Any, n_vocab: int, model: str) -> list[int]:
    """``tokens`` as a list of the target's token ids; llama.cpp would refuse an id outside its
    vocabulary only with a decode status that reads like a full context."""
    if isinstance(tokens, (str, bytes)):
        raise SettingsError(
            "stream_tokens takes token ids, got text", hint="use stream()/generate() for a text prompt"
        )
    try:
        ids = [operator.index(t) for t in tokens]
    except TypeError:
        raise SettingsError(
            "tokens must be a list of token ids (whole numbers)",
            hint="use pipe.tokenize(text) to get them, or stream()/generate() with the text",
        ) from None
    if not ids:
        raise SettingsError("tokens is empty: there is nothing to continue", hint="give at least one token")
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise SettingsError(
            f"token id {ids[bad]} at position {bad} is outside {model}'s vocabulary (0 to {n_vocab - 1})",
            hint="tokenize with this pipeline's target (pipe.tokenize(text))",
        )
    return ids
