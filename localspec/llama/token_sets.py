"""Sets of a vocabulary's token ids that grammars and the engine ask for: the ones that render as no text, and
the ones that are whitespace only. Each is computed with a buffer of its own, so callers need not hold the
engine's lock."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
import numpy as np


def eog_ids(vocab: Any, n_vocab: int) -> frozenset[int]:
    """The ids that end a generation (end of turn, end of text...).

    Args:
        vocab: the ``llama_vocab`` pointer.
        n_vocab: its size.

    Returns:
        The ids.
    """
    return frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))


def textless_ids(vocab: Any, n_vocab: int, eog: frozenset[int]) -> np.ndarray:
    """Ids that render as no text and do not end a generation (control tokens).

    Args:
        vocab: the ``llama_vocab`` pointer.
        n_vocab: its size.
        eog: its end-of-generation ids.

    Returns:
        The ids, ascending.
    """
    buf = ctypes.create_string_buffer(8)
    to_piece = llama_cpp.llama_token_to_piece
    # a piece longer than the buffer answers its length, negated: not empty either way
    ids = [t for t in range(n_vocab) if t not in eog and to_piece(vocab, t, buf, 8, 0, False) == 0]
    return np.array(ids, dtype=np.int64)


def space_ids(vocab: Any, n_vocab: int) -> np.ndarray:
    """Ids whose text is whitespace only (a space, newlines, indentation).

    Args:
        vocab: the ``llama_vocab`` pointer.
        n_vocab: its size.

    Returns:
        The ids, ascending.
    """
    buf = ctypes.create_string_buffer(128)
    to_piece, ids = llama_cpp.llama_token_to_piece, []
    for t in range(n_vocab):
        n = to_piece(vocab, t, buf, 128, 0, False)
        if 0 < n and buf.raw[:n].isspace():
            ids.append(t)
    return np.array(ids, dtype=np.int64)
