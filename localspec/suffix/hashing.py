"""The n-gram keys of the suffix index: a 32-bit hash of a context's last n tokens for every level n.

Tokens of earlier requests live in one int32 array (requests separated by ``-1``). For every n in
:data:`LEVELS` and every position ``p`` that has ``n`` tokens before it and one after it inside the same
request, the hash of ``tokens[p-n:p]`` (salted by n) is stored; all levels share one sorted key array with a
parallel int32 array of positions (a *part*: :func:`build_part` makes one, :func:`merge_parts` joins two).
The same hash is computed in bulk with numpy (:func:`build_part`, :func:`tail_keys`) and per lookup in Python
(:class:`TailQuery`), so the two sides always agree. A key only narrows the search: occurrences are verified
token by token, so a collision never proposes a wrong continuation.
"""

from __future__ import annotations

from array import array
from itertools import accumulate
from operator import mul

import numpy as np

#: The match lengths (in tokens) the index knows; the longest one that matches wins.
LEVELS: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16)
#: Shortest match that may propose anything (a 1-token match wastes wide passes).
MIN_MATCH = LEVELS[0]

_M64 = (1 << 64) - 1
_BASE = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
SALT = {n: (0xD6E8FEB86659FD93 * (n + 1)) & _M64 for n in LEVELS}


def _mix_np(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(31))
    x = x * np.uint64(_MIX1)
    x = x ^ (x >> np.uint64(29))
    x = x * np.uint64(_MIX2)
    return (x >> np.uint64(32)).astype(np.uint32)


def _mix_py(x: int) -> int:
    x ^= x >> 31
    x = (x * _MIX1) & _M64
    x ^= x >> 29
    x = (x * _MIX2) & _M64
    return x >> 32


_POWERS = [pow(_BASE, i, 1 << 64) for i in range(LEVELS[-1])]
#: The sum of the first n powers: every token counts as itself + 1 (so that token 0 counts), and
#: sum((t + 1) * B**i) == sum(t * B**i) + this.
_OFFSETS = [sum(_POWERS[:n]) for n in range(LEVELS[-1] + 1)]
#: The levels a tail of n tokens is long enough for, ascending.
_LEVELS_UPTO = [tuple(lv for lv in LEVELS if lv <= n) for n in range(LEVELS[-1] + 1)]


class TailQuery:
    """The context's last tokens as the groups look them up: the key of each level (mixed when first
    needed: the longest level is usually the only one searched) and the bytes of its n-gram."""

    __slots__ = ("_bytes", "_keys", "_sums", "levels", "tail")

    def __init__(self, tail: list[int]) -> None:
        self.tail = tail
        # the hash of the last n tokens, before its offset, salt and mix: the n-th running sum of
        # token * power, from the last token back (computed in C, reduced mod 2**64 where a key reads it)
        self._sums = list(accumulate(map(mul, reversed(tail), _POWERS)))
        self.levels = _LEVELS_UPTO[min(len(tail), LEVELS[-1])]
        self._keys: dict[int, int] = {}
        self._bytes: bytes | None = None

    def key(self, n: int) -> int:
        """The hash key of the last n tokens (what :func:`build_part` stores for them)."""
        key = self._keys.get(n)
        if key is None:
            h = ((self._sums[n - 1] + _OFFSETS[n]) & _M64) ^ SALT[n]
            key = self._keys[n] = _mix_py(h)
        return key

    def want(self, n: int) -> bytes:
        """The last n tokens as the bytes of an int32 array (empty, so never equal, for a tail that an
        int32 array cannot hold)."""
        data = self._bytes
        if data is None:
            data = self._bytes = int32_bytes(self.tail)
        return data[len(data) - 4 * n :] if len(data) >= 4 * n else b""


Part = tuple[np.ndarray, np.ndarray]  # sorted uint32 keys, int32 continuation positions
EMPTY_PART: Part = (np.zeros(0, np.uint32), np.zeros(0, np.int32))


def _rolling(tokens: np.ndarray, top: int):
    """Yield (n, h) for n = 1..top: h[j] hashes tokens[j-n+1 .. j] (a -1 separator counts as 0)."""
    t = tokens.astype(np.uint64) + np.uint64(1)
    h = np.zeros(len(tokens), dtype=np.uint64)
    power = np.uint64(1)
    with np.errstate(over="ignore"):
        for n in range(1, min(top, len(tokens)) + 1):
            h[n - 1 :] += t[: len(t) - n + 1] * power
            power = power * np.uint64(_BASE)
            yield n, h


def build_part(tokens: np.ndarray) -> Part:
    """Sorted (keys, continuation positions) of every level's n-grams in ``tokens``.

    An entry (n, p) stands for the n tokens before position p; p itself must be a token of the same
    request (no separator in ``tokens[p-n .. p]``). Within one key, positions ascend.
    """
    sep = np.concatenate([[0], np.cumsum(tokens < 0)])
    all_keys, all_pos = [], []
    for n, h in _rolling(tokens, LEVELS[-1]):
        if n not in SALT:
            continue
        p = np.arange(n, len(tokens), dtype=np.int64)
        p = p[(sep[p + 1] - sep[p - n]) == 0]
        all_keys.append(_mix_np(h[p - 1] ^ np.uint64(SALT[n])))
        all_pos.append(p.astype(np.int32))
    if not all_keys:
        return EMPTY_PART
    keys = np.concatenate(all_keys)
    pos = np.concatenate(all_pos)
    order = np.argsort(keys, kind="stable")
    return keys[order], pos[order]


def merge_parts(a: Part, b: Part) -> Part:
    """Two sorted parts as one; within a key, ``a``'s positions stay first.

    ``b``'s entries go where a binary search in ``a`` puts them (after ``a``'s equal keys) and ``a``'s fill
    the rest in order: one search per entry of ``b`` (usually the smaller part) and a copy of ``a``,
    several times faster than a stable argsort of both (the same arrays), and paid after a request's last
    token.
    """
    (a_keys, a_pos), (b_keys, b_pos) = a, b
    n = a_keys.size + b_keys.size
    at = np.searchsorted(a_keys, b_keys, side="right") + np.arange(b_keys.size)
    keys, pos = np.empty(n, a_keys.dtype), np.empty(n, a_pos.dtype)
    keys[at], pos[at] = b_keys, b_pos
    rest = np.ones(n, dtype=bool)
    rest[at] = False
    keys[rest], pos[rest] = a_keys, a_pos
    return keys, pos


def int32_bytes(tokens: list[int]) -> bytes:
    """Tokens as the bytes of an int32 array (empty, so equal to no stored slice, where one does not fit)."""
    try:
        return array("i", tokens).tobytes() if _INT_IS_32 else np.asarray(tokens, np.int32).tobytes()
    except (OverflowError, TypeError):
        return b""


_INT_IS_32 = array("i").itemsize == 4


def tail_keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """Keys of level n for every run of n consecutive tokens (the query side of :func:`build_part`)."""
    for level, h in _rolling(tokens, n):
        if level == n:
            return _mix_np(h[n - 1 :] ^ np.uint64(SALT[n]))
    return np.zeros(0, np.uint32)
