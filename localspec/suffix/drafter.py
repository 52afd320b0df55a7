"""The suffix cache: draft from what followed the same context before, in this request or any earlier one.

:class:`SuffixIndex` finds the longest earlier occurrences of the context's suffix in four places:
the current request (prompt and output so far; source ``"prompt"``), every earlier request of this
process and the persisted store (``"history"``), and an indexed corpus of the user's files
(``"corpus"``). Following the occurrences forward gives a continuation with, per token, a confidence:
how often that token followed that context (child count / parent count along the path, as in
SuffixDecoding), smoothed so that one observation is not certainty. :func:`choose_length` then keeps
only as many tokens as pay for the wider verify pass on this machine, and :class:`SuffixDrafter`
serves it all to the engine (a :class:`localspec.decoding.drafters.Drafter`).

How lookups stay in microseconds at a million tokens
----------------------------------------------------
Tokens of earlier requests live in one int32 array (requests separated by ``-1``). For every n in
:data:`LEVELS` and every position ``p`` that has ``n`` tokens before it and one after it inside the same
request, a 32-bit hash of ``tokens[p-n:p]`` (salted by n) is stored; all levels share one sorted key
array with a parallel int32 array of positions. Occurrences are verified token by token (a hash collision
never proposes a wrong continuation). Memory: 4 bytes per token plus 8 bytes per (token, level): about 60
MB per million tokens with seven levels (and at most 512 KB per part for its directory). New requests go
into a small *recent* part (sorted merge of two sorted runs, linear), which is merged into the *base*
part when it grows past a quarter of it; the oldest requests are evicted when the history passes its
token cap (a filter of sorted arrays, no re-sort). A lookup searches the longest level first (usually the
answer), then the shorter ones until one has a verified occurrence; each key is bisected inside its
bucket of a small directory of each part, so a search touches a few cache lines of the key array instead
of missing the cache at most of its 23 levels, and the newest candidates are verified first, with byte
comparisons in Python, only until there are :data:`MAX_HITS`. The current request (it changes every
round) uses a plain dict from each pair of tokens to the positions that follow it; a lookup extends the
candidates of the last pair backwards to their match lengths. A drafter's round costs about 62 us median
at a million stored tokens on the Xeon VM (0.82x the previous version's 74-79 us in the same half hour), of
which the index's lookup and walk are 36-38 us and the drafter's calibration the rest
(``scripts/bench_suffix_store.py``; docs/bench.md), and the answers are the plain search's, bit for bit
(``tests/test_suffix.py`` compares them).

Confidence of the i-th drafted token after a match of length L:
``(count + a * prior(L + i)) / (parent + a)`` with ``a = 1`` and a prior that grows with the context
length (a 2-token context is a weak predictor, a 16-token one a strong one). :class:`SuffixDrafter`
further calibrates it online from what the target accepted: per kind of proposal and drafted position,
the acceptance of a token given the ones before it were accepted (copies run in bursts).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import mul
from typing import Any, Protocol

import numpy as np

from localspec.decoding.drafters import SOURCES, Draft
from localspec.llama.sampling import SamplingParams

#: The match lengths (in tokens) the index knows; the longest one that matches wins.
LEVELS: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16)
#: Shortest match that may propose anything (a 1-token match wastes wide passes).
MIN_MATCH = LEVELS[0]
#: How far back a match of the longest level is followed (:attr:`Match.extent`): a proposal after a
#: 64-token match is a copy under way. Measured on the recorded agent sessions (prompt source): of the
#: proposals after a 16-23-token match 16% ran 16 tokens or more, after a 32-47-token match 59%.
EXTENTS: tuple[int, ...] = (32, 64)
#: At most this many occurrences (the most recent ones) are followed per source and round.
MAX_HITS = 32
#: Smoothing strength ``a`` (pseudo-observations at the prior).
SMOOTHING = 1.0
#: A draft must promise this much more than the target alone (expected tokens per unit of cost) to be
#: proposed: the confidences are estimates, and on a machine whose 2-token pass costs two single passes
#: (measured here: V(2) = 2.0) a marginal bet loses more often than the estimate says. Measured on the Qwen
#: agent sessions, drafts near 1.0 were accepted 42% of the time.
DRAFT_MARGIN = 0.1
#: Drafts never run past this many tokens, whatever the caller allows.
MAX_DRAFT = 64

_M64 = (1 << 64) - 1
_BASE = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_SALT = {n: (0xD6E8FEB86659FD93 * (n + 1)) & _M64 for n in LEVELS}


def linear_verify_cost(b: int) -> float:
    """A default verify-cost curve: a b-token pass costs 1 + 0.42 (b - 1) single passes (a Xeon VM)."""
    return 1.0 + 0.42 * (b - 1)


def choose_length(confidence: Sequence[float], verify_cost: Callable[[int], float]) -> int:
    """How many of the proposed tokens to draft: the k that maximises expected tokens per unit cost.

    ``confidence[i]`` is the probability that token i is accepted given that all before it were. A
    k-token draft is a verify pass of width k + 1 costing ``verify_cost(k + 1)`` single passes
    (``verify_cost(1) == 1``) and yields ``1 + sum_{i<k} prod_{j<=i} confidence[j]`` tokens on average.
    Returns 0 (no draft) when no length beats the target alone; ties go to the shorter draft.
    """
    return best_length(confidence, verify_cost)[0]


def best_length(confidence: Sequence[float], verify_cost: Callable[[int], float]) -> tuple[int, float]:
    """:func:`choose_length`'s k and its expected tokens per single-pass cost (1.0 for the target alone)."""
    best_k, best = 0, 1.0 / verify_cost(1)
    expected, run = 1.0, 1.0
    for i, c in enumerate(confidence):
        run *= min(max(float(c), 0.0), 1.0)
        expected += run
        value = expected / verify_cost(i + 2)
        if value > best + 1e-12:
            best_k, best = i + 1, value
    return best_k, best


def prior(context_len: int) -> float:
    """Prior probability that a continuation seen once after a context of this length repeats."""
    return 1.0 - 0.6 * 0.8 ** max(context_len - MIN_MATCH, 0)


_PRIORS = [prior(n) for n in range(LEVELS[-1] + MAX_DRAFT + 1)]


def smoothed(count: int, parent: int, context_len: int) -> float:
    """A frequency with :data:`SMOOTHING` pseudo-observations at :func:`prior` (one sighting: not certain)."""
    return (count + SMOOTHING * prior(context_len)) / (parent + SMOOTHING)


# Hashing -----------------------------------------------------------------------------------------------
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


class _Query:
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
        """The hash key of the last n tokens (what :func:`_build` stores for them)."""
        key = self._keys.get(n)
        if key is None:
            h = ((self._sums[n - 1] + _OFFSETS[n]) & _M64) ^ _SALT[n]
            key = self._keys[n] = _mix_py(h)
        return key

    def want(self, n: int) -> bytes:
        """The last n tokens as the bytes of an int32 array (empty, so never equal, for a tail that an
        int32 array cannot hold)."""
        data = self._bytes
        if data is None:
            data = self._bytes = _int32_bytes(self.tail)
        return data[len(data) - 4 * n :] if len(data) >= 4 * n else b""


#: Up to this many windows are read in Python; more in numpy (one gather).
_PY_WINDOWS = 12
#: Live-request candidates whose match length is measured in Python; more in numpy.
_PY_LIVE = 48
#: The longest level at most n tokens long, by n (0: none).
_LEVEL_AT = [max((lv for lv in LEVELS if lv <= n), default=0) for n in range(LEVELS[-1] + 1)]
_BACK = np.arange(1, LEVELS[-1] + 1)

_Part = tuple[np.ndarray, np.ndarray]  # sorted uint32 keys, int32 continuation positions
_EMPTY_PART: _Part = (np.zeros(0, np.uint32), np.zeros(0, np.int32))


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


def _build(tokens: np.ndarray) -> _Part:
    """Sorted (keys, continuation positions) of every level's n-grams in ``tokens``.

    An entry (n, p) stands for the n tokens before position p; p itself must be a token of the same
    request (no separator in ``tokens[p-n .. p]``). Within one key, positions ascend.
    """
    sep = np.concatenate([[0], np.cumsum(tokens < 0)])
    all_keys, all_pos = [], []
    for n, h in _rolling(tokens, LEVELS[-1]):
        if n not in _SALT:
            continue
        p = np.arange(n, len(tokens), dtype=np.int64)
        p = p[(sep[p + 1] - sep[p - n]) == 0]
        all_keys.append(_mix_np(h[p - 1] ^ np.uint64(_SALT[n])))
        all_pos.append(p.astype(np.int32))
    if not all_keys:
        return _EMPTY_PART
    keys = np.concatenate(all_keys)
    pos = np.concatenate(all_pos)
    order = np.argsort(keys, kind="stable")
    return keys[order], pos[order]


def _merge(a: _Part, b: _Part) -> _Part:
    """Two sorted parts as one; within a key, ``a``'s positions stay first.

    ``b``'s entries go where a binary search in ``a`` puts them (after ``a``'s equal keys) and ``a``'s fill
    the rest in order: one search per entry of ``b`` (usually the smaller part) and a copy of ``a``. A
    stable argsort of both gave the same arrays at 2.3-4.3x the time (177 -> 78 ms merging 0.9M entries
    into 7M, 1.4 s -> 0.33 s for 3.5M into 28M), paid after a request's last token.
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


@dataclass(slots=True)
class Match:
    """Occurrences of the context's suffix in one source: the match length and the following tokens."""

    source: str
    length: int
    windows: list[list[int]]  # per occurrence (oldest first), the tokens that followed it (cut at its end)
    extent: int = 0  # the longest of :data:`EXTENTS` some occurrence matches back to (else ``length``)


@dataclass(slots=True)
class Proposal:
    """A continuation from one source, with a smoothed confidence per token."""

    source: str = ""
    match_length: int = 0
    tokens: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    counts: list[tuple[int, int]] = field(default_factory=list)  # (child, parent) per token
    extent: int = 0  # the match's :attr:`Match.extent`


class _Group:
    """Token sequences of one source (history or corpus) with the sorted n-gram index over them."""

    def __init__(self, source: str, merge_at: int = 1 << 16) -> None:
        self.source = source
        self.merge_at = merge_at  # the recent part is merged into the base part past max(this, base / 4)
        self.buf = np.full(1024, -1, dtype=np.int32)
        self.size = 0  # tokens used in buf (requests are followed by a -1)
        self.starts: list[int] = []  # where each request begins in buf
        self.base = _EMPTY_PART
        self.recent = _EMPTY_PART
        self.recent_from = 0  # buf offset where the recent part begins
        self.added = 0  # requests ever added (restored ones included)
        self.dropped = 0  # requests ever evicted: the group holds requests dropped .. added - 1
        self._bytes: memoryview | None = None  # buf as bytes and as ints (see views), while it is buf
        self._ints: memoryview | None = None
        self._views_of: np.ndarray | None = None
        self._directories: dict[int, tuple[np.ndarray, memoryview, memoryview, int]] = {}  # by id(keys)
        # the parts' keys the search tuples were made for, and the tuples (see _searchable)
        self._searches: tuple[np.ndarray, np.ndarray, list] | None = None

    @property
    def tokens(self) -> np.ndarray:
        return self.buf[: self.size]

    @property
    def n_tokens(self) -> int:
        return self.size - len(self.starts)  # not counting separators

    def add(self, seq: Sequence[int] | np.ndarray) -> None:
        arr = np.asarray(seq, dtype=np.int32)
        if arr.size == 0:
            return
        need = self.size + arr.size + 1
        if need > self.buf.size:
            grown = np.full(max(need, 2 * self.buf.size), -1, dtype=np.int32)
            grown[: self.size] = self.buf[: self.size]
            self.buf = grown
        at = self.size
        self.buf[at : at + arr.size] = arr
        self.buf[at + arr.size] = -1
        self.size = need
        self.starts.append(at)
        self.added += 1
        part = _build(self.buf[at : self.size])
        part = (part[0], part[1] + np.int32(at))
        self.recent = _merge(self.recent, part) if self.recent[0].size else part
        if self.size - self.recent_from > max(self.merge_at, self.recent_from // 4):
            self.compact()

    def compact(self) -> None:
        """Merge the recent part into the base part."""
        if self.recent[0].size:
            self.base = _merge(self.base, self.recent) if self.base[0].size else self.recent
        self.recent = _EMPTY_PART
        self.recent_from = self.size

    def withdraw(self, n: int) -> bool:
        """Take the last ``n`` requests back out, as if they had never been added; False (and nothing
        changed) unless they all lie in the recent part. Their tokens are cut from the end of ``buf``
        (refilled with the separator, as a grown buffer is) and their entries (positions from the first
        one's start on) filtered out of the recent part's sorted arrays, which keeps them sorted: 0.6-1 ms
        for a recent part of 24K-60K tokens; the base part and its search directory are not touched."""
        if n <= 0 or n > len(self.starts) or len(self.starts) != self.added - self.dropped:
            return False
        cut = self.starts[-n]
        if cut < self.recent_from:
            return False  # merged into the base part
        keys, pos = self.recent
        keep = pos < cut
        self.recent = (keys[keep], pos[keep])
        self.buf[cut : self.size] = -1
        self.size = cut
        del self.starts[-n:]
        self.added -= n
        return True

    def evict(self, max_tokens: int) -> int:
        """Drop the oldest requests until at most ``max_tokens`` remain; returns how many were dropped."""
        if self.n_tokens <= max_tokens:
            return 0
        target = int(max_tokens * 0.9)  # evict in batches so eviction stays rare
        drop = 0
        while drop < len(self.starts) and self.n_tokens_from(drop) > target:
            drop += 1
        cut = self.starts[drop] if drop < len(self.starts) else self.size
        self.compact()
        keys, pos = self.base
        keep = pos >= cut  # continuation positions; a window never spans a separator, so all of it is kept
        self.base = (keys[keep], pos[keep] - np.int32(cut))
        self.buf = self.buf[cut:].copy()
        self.size -= cut
        self.starts = [s - cut for s in self.starts[drop:]]
        self.recent_from = self.size
        self.dropped += drop
        return drop

    def n_tokens_from(self, i: int) -> int:
        if i >= len(self.starts):
            return 0
        return self.size - self.starts[i] - (len(self.starts) - i)

    def occurrences(self, query: _Query) -> tuple[int, list[int]]:
        """The longest level whose n-gram occurs (verified), and its most recent positions (oldest first).

        Levels are searched longest first (the longest is usually the answer), one key at a time: each
        key is bisected inside its bucket of the parts' :meth:`_searchable` directories (a few cache
        lines of a key array of tens of megabytes, where a plain binary search misses the cache at most
        of its 23 levels), and the first level with a verified occurrence wins. The same answer as
        searching every level at once (the key 0xFFFFFFFF is never found, as there).
        """
        levels = query.levels
        searches = self._searchable()
        if not levels or not searches:
            return 0, []
        for n in reversed(levels):
            key = query.key(n)
            if key == 0xFFFFFFFF:
                continue
            cands: list[int] = []
            for keys, bounds, shift, pos in searches:
                bucket = key >> shift
                lo, hi = bounds[bucket], bounds[bucket + 1]
                if hi > lo:
                    a = bisect_left(keys, key, lo, hi)
                    if a < hi and keys[a] == key:  # the most recent candidates (a few more than needed:
                        b = bisect_right(keys, key, a, hi)  # collisions are dropped by _verified)
                        cands += pos[max(a, b - 4 * MAX_HITS) : b].tolist()
            if cands:
                hits = self._verified(cands, n, query)
                if hits:
                    return n, hits
        return 0, []

    def _verified(self, cands: list[int], n: int, query: _Query) -> list[int]:
        """The :data:`MAX_HITS` most recent candidate positions preceded by the query's last n tokens
        (ascending, unique: colliding levels share positions). Checked newest first and only until there
        are enough: usually a few byte comparisons in Python instead of a gather over every candidate.

        A candidate with fewer than n tokens before it (another level's entry under a colliding key)
        never matches. (The gather this replaces read such a window with wrapped negative indexes: from
        the end of ``buf``, which always ends with a separator, so it never matched either, or it raised
        IndexError when ``buf`` was shorter than the window.)
        """
        cands.sort(reverse=True)
        want = query.want(n)
        view = self.views()[0]
        width = 4 * n
        hits: list[int] = []
        seen = -1
        for p in cands:
            if p != seen:
                seen = p
                if p >= n and view[4 * p - width : 4 * p] == want:
                    hits.append(p)
                    if len(hits) == MAX_HITS:
                        break
        hits.reverse()
        return hits

    def views(self) -> tuple[memoryview, memoryview]:
        """``buf`` as bytes and as ints (slices of either compare and convert without numpy), kept while
        ``buf`` is the same array."""
        if self._bytes is None or self._ints is None or self._views_of is not self.buf:
            self._bytes = self.buf.data.cast("B")
            self._ints = self._bytes.cast("i")
            self._views_of = self.buf
        return self._bytes, self._ints

    def _searchable(self) -> list[tuple[memoryview, memoryview, int, memoryview]]:
        """Per part with keys: its sorted keys as a memoryview (items are Python ints, for
        :func:`bisect.bisect_left`), where each bucket of keys (by their top bits) begins, the shift that
        gives a key's bucket, and the positions as a memoryview. About 64 keys per bucket, at most 2**16
        buckets (512 KB). A part's directory is built when it is first searched (the base part changes
        at a merge, the recent one at every request: about 5 ms at a million tokens) and kept while the
        part is the same array."""
        held = self._searches
        if held is not None and held[0] is self.base[0] and held[1] is self.recent[0]:
            return held[2]
        searches = []
        directories = {}
        for keys, pos in (self.base, self.recent):
            if not keys.size:
                continue
            d = self._directories.get(id(keys))
            if d is None or d[0] is not keys:
                bits = min(max((keys.size // 64).bit_length(), 1), 16)
                shift = 32 - bits
                edges = (np.arange(1 << bits, dtype=np.uint64) << np.uint64(shift)).astype(np.uint32)
                bounds = np.append(keys.searchsorted(edges), keys.size).astype(np.int64)
                d = (keys, np.ascontiguousarray(keys, dtype=np.uint32).data, bounds.data, shift)
            directories[id(keys)] = d
            searches.append((d[1], d[2], d[3], np.ascontiguousarray(pos, dtype=np.int32).data))
        self._directories = directories
        self._searches = (self.base[0], self.recent[0], searches)
        return searches

    def windows(self, pos: list[int], k: int) -> list[list[int]]:
        """The ``k`` tokens from each position on (the last token of ``buf`` repeats past its end)."""
        if not pos or k <= 0:
            return []
        if len(pos) <= _PY_WINDOWS:
            ints, size = self.views()[1], self.size
            # past the end of buf: shorter than the gather below, but buf ends with a separator and
            # every window is cut at its first one, so the cut windows are the same
            return [ints[p : min(p + k, size)].tolist() for p in pos]
        idx = np.minimum(np.asarray(pos, dtype=np.int64)[:, None] + np.arange(k), self.size - 1)
        return self.buf[idx].tolist()

    def state(self, prefix: str) -> dict[str, np.ndarray]:
        self.compact()
        return {
            f"{prefix}tokens": self.buf[: self.size],
            f"{prefix}starts": np.asarray(self.starts, dtype=np.int64),
            f"{prefix}keys": self.base[0],
            f"{prefix}pos": self.base[1],
        }

    def restore(self, arrays: dict[str, np.ndarray], prefix: str) -> None:
        tokens = arrays[f"{prefix}tokens"]
        self.buf = np.array(tokens, dtype=np.int32)  # a writable copy: appends grow it
        self.size = int(tokens.size)
        self.starts = [int(s) for s in arrays[f"{prefix}starts"]]
        self.base = (arrays[f"{prefix}keys"], arrays[f"{prefix}pos"])
        self.recent = _EMPTY_PART
        self.recent_from = self.size  # everything restored is in the base part
        self.added, self.dropped = len(self.starts), 0


class SuffixIndex:
    """Earlier occurrences of a context's suffix, from the current request, history, and a corpus.

    ``max_history_tokens`` caps the history (the oldest requests go first). ``n_vocab``, when known,
    is the target's vocabulary size: a token outside it is never proposed. ``merge_at``: tokens the
    recent part may hold before it is merged into the base part (small values are for tests).
    """

    def __init__(
        self, *, max_history_tokens: int = 4_000_000, n_vocab: int | None = None, merge_at: int = 1 << 16
    ) -> None:
        self.max_history_tokens = max_history_tokens
        self.n_vocab = n_vocab
        self.history = _Group("history", merge_at)
        self.corpus = _Group("corpus")
        self._live: list[int] = []
        # (a, b) -> the positions p with live[p-2:p] == [a, b], ascending
        self._live_pairs: dict[tuple[int, int], list[int]] = {}
        self._live_indexed = 0
        self._live_arr = np.zeros(0, np.int64)  # a copy of _live[:_live_copied], for many candidates
        self._live_copied = 0
        #: how many times this index was told to :meth:`forget` (a drafter forgets what it learnt then too)
        self.forgotten = 0

    # Feeding ---------------------------------------------------------------------------------------
    def begin(self, context: Sequence[int]) -> None:
        """A new request: index its prompt (forgetting the previous request's live tables)."""
        self._live = list(context)
        self._live_pairs = {}
        self._live_indexed = 0
        self._live_copied = 0
        self._index_live()

    def extend(self, context: Sequence[int]) -> None:
        """The current request grew (the engine appends emitted tokens); index the new positions."""
        live = self._live
        if len(context) < len(live) or (live and context[len(live) - 1] != live[-1]):
            self.begin(context)
            return
        live.extend(context[len(live) :])
        self._index_live()

    def _index_live(self) -> None:
        """Index the new positions by the two tokens before them (a match of any level ends in those)."""
        live, pairs = self._live, self._live_pairs
        for p in range(max(self._live_indexed, MIN_MATCH), len(live)):
            key = (live[p - 2], live[p - 1])
            hits = pairs.get(key)
            if hits is None:
                pairs[key] = [p]
            else:
                hits.append(p)
        self._live_indexed = len(live)

    def _live_match(self, k: int) -> Match | None:
        """The current request's longest earlier occurrences of its own suffix (see :meth:`matches`).

        Every occurrence of an n-gram ends in an occurrence of its last two tokens: each of those is
        extended backwards to its match length (up to the longest level), and the longest level any of
        them reaches wins, with the occurrences that reach it.
        """
        live = self._live
        size = len(live)
        cands = self._live_pairs.get((live[-2], live[-1])) if size >= MIN_MATCH else None
        if not cands:
            return None
        lengths = self._live_lengths(cands) if len(cands) > _PY_LIVE else None
        if lengths is None:
            lengths = []
            longest = LEVELS[-1]
            for p in cands:
                top = p if p < longest else longest
                n = 2
                while n < top and live[p - n - 1] == live[size - n - 1]:
                    n += 1
                lengths.append(n)
        level = _LEVEL_AT[max(lengths)]
        hits = [p for p, n in zip(cands, lengths, strict=True) if n >= level][-MAX_HITS:]
        extent = level
        if level == LEVELS[-1]:
            extent = _extent(hits, live, live)
        return Match("prompt", level, [live[p : p + k] for p in hits], extent)

    def _live_lengths(self, cands: list[int]) -> list[int] | None:
        """:meth:`_live_match`'s match lengths in numpy (None: tokens that numpy cannot hold)."""
        live = self._live
        size = len(live)
        try:
            if self._live_arr.size < size:
                grown = np.zeros(max(size, 2 * self._live_arr.size, 1024), np.int64)
                grown[: self._live_copied] = self._live_arr[: self._live_copied]
                self._live_arr = grown
            if self._live_copied < size:
                self._live_arr[self._live_copied : size] = live[self._live_copied :]
                self._live_copied = size
        except (OverflowError, TypeError, ValueError):
            self._live_copied = 0
            return None
        arr = self._live_arr
        back = np.asarray(cands, dtype=np.int64)[:, None] - _BACK  # p - i for i = 1..16
        same = (arr[np.maximum(back, 0)] == arr[np.maximum(size - _BACK, 0)]) & (back >= 0)
        return np.where(same.all(axis=1), LEVELS[-1], same.argmin(axis=1)).tolist()

    @property
    def history_added(self) -> int:
        """Requests ever added to the history (restored ones included): what a store's journal counts."""
        return self.history.added

    @property
    def history_dropped(self) -> int:
        """Requests ever evicted from the history (since it was created or restored)."""
        return self.history.dropped

    def history_since(self, added: int) -> list[np.ndarray]:
        """The token arrays of the requests added after the first ``added`` (oldest first); every one
        must still be held (nothing evicted since: see :attr:`history_dropped`)."""
        g = self.history
        first = added - g.dropped
        if first < 0:
            raise ValueError("requests added since then were evicted")
        ends = [*g.starts[1:], g.size]
        return [g.buf[g.starts[i] : ends[i] - 1] for i in range(first, len(g.starts))]

    def add_request(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Remember a finished request (prompt and output) for every later one."""
        self.history.add(tokens)
        self.history.evict(self.max_history_tokens)

    def withdraw(self, n: int) -> bool:
        """Take the last ``n`` requests added to the history back out (False, and nothing changed, when
        they were merged into its base part since, or evicted): what a store does to put another process's
        requests before this one's, in the order its files hold them (see
        :meth:`localspec.suffix.store.SuffixStore.save`)."""
        return self.history.withdraw(n)

    def adopt(self, other: SuffixIndex) -> None:
        """Hold ``other``'s history and corpus instead of this index's own (the current request's tables
        stay): what a store does when another process saved since (see
        :meth:`localspec.suffix.store.SuffixStore.save`)."""
        self.history, self.corpus = other.history, other.corpus
        self.history.evict(self.max_history_tokens)

    def forget(self) -> None:
        """Drop the history and corpus (the current request's tables stay): the user cleared the cache
        (``localspec cache clear``), see :meth:`localspec.suffix.store.SuffixStore.save`. :attr:`forgotten`
        counts it, so a drafter forgets what it learnt about this index's copies too."""
        self.adopt(SuffixIndex(max_history_tokens=self.max_history_tokens, n_vocab=self.n_vocab))
        self.forgotten += 1

    def set_corpus(self, documents: Iterable[Sequence[int]]) -> None:
        """Replace the corpus with these token sequences (one per file)."""
        group = _Group("corpus")
        parts = [np.asarray(d, dtype=np.int32) for d in documents]
        parts = [p for p in parts if p.size]
        if parts:
            sep = np.array([-1], dtype=np.int32)
            flat = np.concatenate([x for p in parts for x in (p, sep)])
            group.buf = flat
            group.size = int(flat.size)
            group.starts = list(np.concatenate([[0], np.cumsum([p.size + 1 for p in parts])[:-1]]).tolist())
            group.base = _build(flat)
            group.recent_from = group.size
            group.added = len(group.starts)
        self.corpus = group

    # Sizes -----------------------------------------------------------------------------------------
    @property
    def history_tokens(self) -> int:
        return self.history.n_tokens

    @property
    def history_requests(self) -> int:
        return len(self.history.starts)

    @property
    def corpus_tokens(self) -> int:
        return self.corpus.n_tokens

    @property
    def corpus_documents(self) -> int:
        return len(self.corpus.starts)

    def nbytes(self) -> int:
        """Bytes held by the history and corpus arrays and their search directories (the live request's
        dicts not counted)."""
        total = 0
        for g in (self.history, self.corpus):
            total += g.buf.nbytes + sum(a.nbytes for part in (g.base, g.recent) for a in part)
            total += sum(d[2].nbytes for d in g._directories.values())
        return total

    # Lookup ----------------------------------------------------------------------------------------
    def matches(self, context: Sequence[int], k: int) -> list[Match]:
        """Per source with a match of at least :data:`MIN_MATCH` tokens: the longest match and up to
        ``k`` following tokens of each of its (at most :data:`MAX_HITS` most recent) occurrences."""
        out: list[Match] = []
        if len(context) < MIN_MATCH or k <= 0:
            return out
        self.extend(context)
        live = self._live_match(k)
        if live is not None:
            out.append(live)
        query = _Query(list(map(int, context[-LEVELS[-1] :])))
        for group in (self.history, self.corpus):
            if group.size:
                n, pos = group.occurrences(query)
                if n:
                    cut = [_until_separator(w) for w in group.windows(pos, k)]
                    extent = n
                    if n == LEVELS[-1]:
                        extent = _extent(pos, group.views()[0], context)
                    out.append(Match(group.source, n, cut, extent))
        return out

    def propose(self, context: Sequence[int], k: int) -> list[Proposal]:
        """A continuation of up to ``k`` tokens per source that matched (the most frequent path)."""
        k = min(k, MAX_DRAFT)
        props = [walk(m, k) for m in self.matches(context, k)]
        n_vocab = self.n_vocab
        if n_vocab is not None:
            for p in props:
                if p.tokens and 0 <= min(p.tokens) and max(p.tokens) < n_vocab:
                    continue  # all inside the vocabulary (the usual case)
                bad = next((i for i, t in enumerate(p.tokens) if not 0 <= t < n_vocab), None)
                if bad is not None:
                    del p.tokens[bad:], p.confidence[bad:], p.counts[bad:]
        return [p for p in props if p.tokens]

    def overlap(self, context: Sequence[int], *, n: int = 4, window: int = 512) -> float:
        """Fraction of the last ``window`` tokens' n-grams (n in :data:`LEVELS`) seen in history or corpus."""
        tail = np.asarray(context[-window:], dtype=np.int32)
        if tail.size < n or n not in _SALT:
            return 0.0
        want = _tail_keys(tail, n)
        seen = np.zeros(want.size, dtype=bool)
        for group in (self.history, self.corpus):
            for keys, _ in (group.base, group.recent):
                if keys.size:
                    i = np.searchsorted(keys, want)
                    seen |= keys[np.minimum(i, keys.size - 1)] == want
        return float(seen.mean()) if want.size else 0.0

    # Persistence -----------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """The arrays that rebuild this index (what a store persists)."""
        return {**self.history.state("history_"), **self.corpus.state("corpus_")}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], **kwargs) -> SuffixIndex:
        """The inverse of :meth:`state` (arrays are trusted: the store checks them first)."""
        index = cls(**kwargs)
        index.history.restore(arrays, "history_")
        index.corpus.restore(arrays, "corpus_")
        index.history.evict(index.max_history_tokens)
        return index


def _extent(hits: list[int], seq: Sequence[int] | memoryview, context: Sequence[int]) -> int:
    """The longest of :data:`EXTENTS` that the last tokens of ``context`` match before some position of
    ``hits`` in ``seq`` (all of them already match the longest level); the longest level if none. ``seq``
    is a list of tokens or a group's tokens as bytes (:meth:`_Group.views`: slices compare in C). Newest
    occurrences first, stopping at the first that matches: per extent at most ``len(hits)`` (<=
    :data:`MAX_HITS`) comparisons of ``extent - 16`` tokens, and only when the longest level matched."""
    best = LEVELS[-1]
    n = len(context)
    raw = isinstance(seq, memoryview)
    for extent in EXTENTS:
        if n < extent:
            break
        want: Any = list(context[n - extent : n - best])
        scale = 1
        if raw:
            want, scale = _int32_bytes(want), 4
        found = False
        for p in reversed(hits):
            if p < extent:
                continue
            if seq[scale * (p - extent) : scale * (p - best)] == want:
                found = True
                break
        if not found:
            break
        best = extent
    return best


def _int32_bytes(tokens: list[int]) -> bytes:
    """Tokens as the bytes of an int32 array (empty, so equal to no stored slice, where one does not fit)."""
    try:
        return array("i", tokens).tobytes() if _INT_IS_32 else np.asarray(tokens, np.int32).tobytes()
    except (OverflowError, TypeError):
        return b""


_INT_IS_32 = array("i").itemsize == 4


def _tail_keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """Keys of level n for every run of n consecutive tokens (the query side of :func:`_build`)."""
    for level, h in _rolling(tokens, n):
        if level == n:
            return _mix_np(h[n - 1 :] ^ np.uint64(_SALT[n]))
    return np.zeros(0, np.uint32)


def _until_separator(window: list[int]) -> list[int]:
    return window[: window.index(-1)] if -1 in window else window


def walk(match: Match, k: int) -> Proposal:
    """Follow the most frequent continuation of ``match``'s occurrences, token by token.

    At each step the occurrences still on the path vote for the next token; the winner has the most
    votes (a tie goes to the one seen most recently), and its confidence is :func:`smoothed` of
    (votes, occurrences that continue). Occurrences that disagree or end leave the path.
    """
    tokens: list[int] = []
    confidence: list[float] = []
    counts: list[tuple[int, int]] = []
    rows = [w if len(w) <= k else w[:k] for w in match.windows if w]  # never changed below: no copy
    i = 0
    while rows and i < k:
        # the stretch on which every remaining occurrence agrees needs no vote (the common case). The
        # rows on the path agree on their first i tokens, so it ends where the smallest and the largest
        # row (compared in C) part (as os.path.commonprefix finds it, without copying the rows)
        if len(rows) > 1 and rows.count(rows[0]) < len(rows):
            lo, hi = min(rows), max(rows)
            end = min(len(lo), len(hi))
            j = i
            while j < end and lo[j] == hi[j]:
                j += 1
            same = j - i
        else:  # (one row, or every row the same: list equality, in C)
            same = len(rows[0]) - i
        if same:
            c = len(rows)
            at = match.length + i
            tokens.extend(rows[0][i : i + same])
            counts.extend([(c, c)] * same)
            confidence.extend(_unanimous(c)[at : at + same])
            i += same
        else:
            col = [r[i] for r in rows]
            votes: dict[int, int] = {}
            for t in col:
                votes[t] = votes.get(t, 0) + 1
            most = max(votes.values())
            # a tie goes to the token seen most recently: the first with the most votes from the end
            tok = next(t for t in reversed(col) if votes[t] == most)
            tokens.append(int(tok))
            counts.append((most, len(col)))
            at = match.length + i
            p = _PRIORS[at] if at < len(_PRIORS) else prior(at)
            confidence.append((most + SMOOTHING * p) / (len(col) + SMOOTHING))  # smoothed(), from the table
            rows = [r for r in rows if r[i] == tok]
            i += 1
        rows = [r for r in rows if len(r) > i]  # occurrences that end leave the path
    return Proposal(match.source, match.length, tokens, confidence, counts, max(match.extent, match.length))


_UNANIMOUS: dict[int, list[float]] = {}


def _unanimous(c: int) -> list[float]:
    """By context length: the smoothed frequency of a token all ``c`` occurrences continue with."""
    row = _UNANIMOUS.get(c)
    if row is None:
        row = _UNANIMOUS[c] = [(c + SMOOTHING * p) / (c + SMOOTHING) for p in _PRIORS]
    return row


# The drafter ---------------------------------------------------------------------------------------
class Saver(Protocol):
    """Something that persists the index (and the drafter's calibration and token table) after a request
    (:class:`localspec.suffix.store.SuffixStore`)."""

    def save(
        self,
        index: SuffixIndex,
        calibration: Sequence[Cell] | None = None,
        tokens: Sequence[TokenCell] = (),
    ) -> bool: ...


#: Match lengths that start a new band of :func:`kind_of` (2-3, 4-7, 8-11, 12-15, 16-31, 32-63 and 64 or
#: more tokens, the last two from :attr:`Proposal.extent`).
_BANDS = (4, 8, 12, 16, *EXTENTS)
_BAND_AT = [sum(length >= edge for edge in _BANDS) for length in range(_BANDS[-1] + 1)]  # by match length
#: Drafted position -> calibration bucket: 0, 1, 2-3, 4-7, 8-15, 16-31, 32 and later.
_POSITION = tuple(min(i.bit_length(), 6) for i in range(MAX_DRAFT + 1))
#: The runs of :data:`_POSITION`: (bucket, first position, end).
_SEGMENTS = tuple(
    (bucket, _POSITION.index(bucket), len(_POSITION) - _POSITION[::-1].index(bucket))
    for bucket in sorted(set(_POSITION))
)
_BUCKET_END = tuple(end for _, start, end in _SEGMENTS for _ in range(start, end))  # by position
_CALIBRATION_WEIGHT = 4.0  # pseudo-trials at the prior before measured acceptance dominates
#: Before any evidence a position is trusted at this fraction of its smoothed frequency. One earlier
#: occurrence scores ~0.95, but on the Qwen agent sessions such drafts were accepted 31% of the time, and
#: on a machine whose 2-token pass costs two single ones each wrong draft costs a whole token per drafted
#: token. Evidence comes free (see :class:`SuffixDrafter`), so a kind earns its drafts without paying
#: for wrong ones; where verifying is cheap (a flat V(b)) the discounted prior still drafts at once.
PRIOR_TRUST = 0.75
#: Proposals of one kind watched at once (each round's proposals are watched until one is wrong or ends).
WATCHES_PER_KIND = 8

Kind = tuple[str, int, bool, int]
#: One calibration cell as a store keeps it: a :data:`Kind`'s fields, the position bucket, then the trials
#: that reached that position and how many of them were accepted.
Cell = tuple[str, int, bool, int, int, float, float]
#: A request starts from the calibration the last one left (saved with the store, for a new process), each
#: cell scaled down to at most this many trials (its acceptance kept): enough to draft at once where copies
#: ran before, few enough that this request's own evidence soon outweighs it.
CARRIED_TRIALS = 64
#: Only these sources' cells are carried: how far a copy of the request's own prompt runs (an editor's
#: file, the earlier turns of a chat) is a property of the model and the kind of work, and carries over;
#: how closely a new request follows earlier ones or the corpus is not, and is learnt afresh. Measured with
#: a new process per request from a warm store (docs/bench.md, native build), carrying every source made
#: the edit session 1.77x instead of 1.66x but the repository workload 0.91x instead of 0.98x; carrying the
#: prompt's cells alone, 1.71x and 0.97x (agent loop 1.12x, conversation 1.27x, against 1.08x and 1.23x).
#: The same holds between two requests of one process (a server, a bench session): keeping what one
#: request learnt of history and corpus copies for the next made the repository workload draft them at
#: 13-20% acceptance in its later requests, so :meth:`SuffixDrafter.begin` starts every request from this
#: carry. Side by side in one process (``scripts/ab_request_start.py``, native / AVX2): repository 0.95 ->
#: 1.02x / 0.98 -> 0.99x, for the conversation 1.33 -> 1.29x / 1.16 -> 1.14x and the edit session -0.6%.
#: The drafter's token table (see :data:`TOKEN_WEIGHT`) is carried for these sources alone, too.
CARRIED_SOURCES = ("prompt",)
_CELL_SOURCES = tuple(s for s in SOURCES if s != "model")  # what the suffix index proposes from

#: Pseudo-trials at its source's rate before a token's own acceptance counts (see :class:`SuffixDrafter`,
#: *token hazard*). Replayed on the recorded sessions of this project's EPYC VM (AVX2 build, steep curve)
#: with the table the warm-up requests left: 1, 4 and 16 gave the edit session 1.50 / 1.49 / 1.51x (1.39x
#: without), the agent loop 1.18 / 1.19 / 1.18x (1.13x), the conversation 1.15 / 1.19 / 1.18x (1.18x),
#: the repository 1.06 / 1.05 / 1.04x (0.99x); 4 is the one that loses nowhere.
TOKEN_WEIGHT = 4.0
#: A request starts from the token table the last one left, for :data:`CARRIED_SOURCES` only (the other
#: sources' tables are learnt afresh in every request, as their calibration is: carrying the history's
#: table too made the conversation sessions 4-11% slower in every repeat of a real run, docs/bench.md),
#: the counts scaled down together to at most this many trials in all (their rates kept), and only the
#: :data:`CARRIED_TOKENS` most-reached tokens: the table forgets old work gradually, and a server and a new
#: process per request start alike.
TOKEN_TRIALS = 1 << 14
CARRIED_TOKENS = 4096
#: One token's evidence as a store keeps it: source, token id, trials that reached it, of them accepted.
TokenCell = tuple[str, int, float, float]


def token_cells_from(rows: Iterable[Any], n_vocab: int | None = None) -> list[TokenCell]:
    """Checked token cells (from a store file); raises ValueError naming the first bad one."""
    out: list[TokenCell] = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 4:
            raise ValueError(f"token cell {i} is not a list of 4 fields")
        source, token, reached, accepted = row
        if (
            source not in _CELL_SOURCES
            or type(token) is not int
            or not 0 <= token < (n_vocab if n_vocab else 1 << 31)
            or not all(type(x) in (int, float) and math.isfinite(x) for x in (reached, accepted))
            or not 0 <= accepted <= reached <= TOKEN_TRIALS
        ):
            raise ValueError(f"token cell {i} is out of range: {row!r}")
        out.append((str(source), token, float(reached), float(accepted)))
    return out


def cells_from(rows: Iterable[Any]) -> list[Cell]:
    """Checked calibration cells (from a store file); raises ValueError naming the first bad one."""
    out: list[Cell] = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 7:
            raise ValueError(f"cell {i} is not a list of 7 fields")
        source, band, unanimous, occurrences, bucket, reached, accepted = row
        numbers = (reached, accepted)
        if (
            source not in _CELL_SOURCES
            or type(band) is not int
            or not 0 <= band <= len(_BANDS)
            or type(unanimous) is not bool
            or type(occurrences) is not int
            or not 0 <= occurrences <= 2
            or type(bucket) is not int
            or not 0 <= bucket <= _POSITION[-1]
            or not all(type(x) in (int, float) and math.isfinite(x) for x in numbers)
            or not 0 <= accepted <= reached <= CARRIED_TRIALS
        ):
            raise ValueError(f"cell {i} is out of range: {row!r}")
        out.append((str(source), band, unanimous, occurrences, bucket, float(reached), float(accepted)))
    return out


def _cells_of(cells: Iterable[Cell]) -> dict[tuple[Kind, int], list[float]]:
    """Cells as :attr:`SuffixDrafter.calibration` counts them: (kind, bucket) -> [reached, accepted]."""
    return {
        ((source, band, unanimous, occurrences), bucket): [reached, accepted]
        for source, band, unanimous, occurrences, bucket, reached, accepted in cells
    }


def kind_of(prop: Proposal) -> Kind:
    """What the acceptance of a proposal is learnt by: its source, its match length band (see
    :data:`_BANDS`), whether every occurrence agrees on its first token, and how many occurrences it
    follows (1, 2-3, 4 or more)."""
    length = max(prop.match_length, prop.extent)
    band = _BAND_AT[length] if length < len(_BAND_AT) else len(_BANDS)
    child, parent = prop.counts[0] if prop.counts else (0, 0)
    return (prop.source, band, child == parent, 0 if parent <= 1 else 1 if parent <= 3 else 2)


_COARSE_BAND = 4  # kinds of longer matches (by extent) learn from the 16-token band's evidence too


def lineage_of(kind: Kind) -> tuple[Kind, ...]:
    """The coarser kinds whose evidence a kind starts from, coarsest first (a kind seen rarely borrows
    what its neighbours measured rather than the raw prior): kinds of long extent start from the same
    kind banded at 16+."""
    source, band, unanimous, occurrences = kind
    return ((source, _COARSE_BAND, unanimous, occurrences),) if band > _COARSE_BAND else ()


class _Watch:
    """A proposal being compared with what the target emits, from context position ``at`` on."""

    __slots__ = ("kinds", "kind", "at", "anchor", "tokens", "done")

    def __init__(self, kind: Kind, at: int, anchor: int, tokens: list[int]) -> None:
        self.kinds = (*lineage_of(kind), kind)  # every kind whose cells this proposal's tokens count in
        self.kind = kind
        self.at, self.anchor, self.tokens, self.done = at, anchor, tokens, 0


class SuffixDrafter:
    """Drafts from the suffix index; free (no model call), lossless under the engine's rejection rule.

    Greedy or sampling, a proposal is deterministic given the context (``probs`` entries are None when
    sampling, as for :class:`localspec.decoding.drafters.NgramDrafter`). The draft length is
    :func:`best_length`'s
    for calibrated per-token acceptances and ``verify_cost`` (V(b) of this machine, V(1) = 1).

    Calibration: copies run in bursts. Where an editor's file or an earlier answer is repeated, a proposal
    following a 16-token match is right for 20-30 tokens on end, and where it is not, it fails at once; an
    acceptance per token multiplied along the draft as if independent undervalues exactly the long drafts
    that pay on a CPU (on the Qwen edit session: 92% of drafted tokens accepted, 1.6 per round). So what is
    learnt is the acceptance of the i-th token *given the ones before it were accepted*, per :func:`kind_of`
    the proposal and position bucket (:data:`_POSITION`): a run-length survival curve per kind. Evidence
    is free and plentiful: every round's proposals (drafted or not) are *watched*, compared token by token
    with what the target emits until one differs or the proposal ends (:data:`WATCHES_PER_KIND` at once).
    Replayed on the recorded edit session (``scripts/replay_sessions.py``) rounds accepted 2.6 tokens
    instead of 1.6 (at 86% acceptance instead of 93%); measured, the session ran 1.29x instead of 1.25x.

    Token hazard: the same watches also count, per source and token id, how often a proposed token was
    reached and how often it was accepted. Some tokens are where copies break (a line the model rewrites
    starts with the same few tokens; a number, a name the answer changes), others never are. A token's
    calibrated acceptance is scaled by ``(accepted_t + w r) / ((reached_t + w) r)``, where r is the
    source's rate over all its tokens and w = :data:`TOKEN_WEIGHT` pseudo-trials at it: 1 for a token
    seen no more or less often rejected than the rest. The prompt's table is kept from request to request
    (and in the store), forgetting slowly (:data:`TOKEN_TRIALS`); the history's and corpus' are learnt
    afresh in every request (see :data:`CARRIED_SOURCES`). Measured side by side with the drafter without
    it (docs/bench.md, EPYC VM, AVX2 build, warm store, 3 interleaved repeats): edit session 1.43x against
    1.37x, conversation 1.12x against 1.06x, repository 1.08x against 1.02x, agent loop 1.21x both.
    """

    name = "suffix"
    free = True

    def __init__(
        self,
        index: SuffixIndex | None = None,
        *,
        verify_cost: Callable[[int], float] = linear_verify_cost,
        store: Saver | None = None,
        learn: bool = True,
        margin: float = DRAFT_MARGIN,
        prior_trust: float = PRIOR_TRUST,
        calibration: Iterable[Cell] = (),
        tokens: Iterable[TokenCell] = (),
        token_weight: float = TOKEN_WEIGHT,
    ) -> None:
        self.index = index if index is not None else SuffixIndex()
        self.token_weight = token_weight
        #: per source, per token id: [trials that reached that token in a watched proposal, of them
        #: accepted], and per source the sums (its rate); starts from ``tokens`` (see :data:`TOKEN_TRIALS`)
        self.tokens: dict[str, dict[int, list[float]]] = {}
        self.token_totals: dict[str, list[float]] = {}
        self._set_tokens(tokens)
        self.margin = margin
        self.prior_trust = prior_trust
        self.verify_cost = verify_cost
        self.store = store
        self.learn = learn
        #: per (kind, position bucket): [tokens that reached that position, of them accepted]; starts from
        #: ``calibration`` (what the store kept from the last process, see :data:`CARRIED_TRIALS`)
        self.calibration: dict[tuple[Kind, int], list[float]] = _cells_of(calibration)
        self._watches: list[_Watch] = []
        self._costs: list[float] = []  # verify_cost(b) by b, read once per width
        self._costs_of: Callable[[int], float] | None = None

    def begin(self, context: list[int]) -> None:
        """A new request: it starts from :meth:`carried_calibration`, what a new process would start from,
        so a request drafts the same in a long-lived server as from the command line (see
        :data:`CARRIED_SOURCES`)."""
        self._watches = []
        self.calibration = _cells_of(self.carried_calibration())
        self._set_tokens(self.carried_tokens())
        self.index.begin(context)

    def draft(self, context: list[int], n: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        self._settle(context)
        if n <= 0:
            return Draft(source=self.name)
        best: tuple[float, int, Proposal, list[float], int] | None = None
        open_by_kind: dict[Kind, int] = {}
        for w in self._watches:
            open_by_kind[w.kind] = open_by_kind.get(w.kind, 0) + 1
        for prop in self.index.propose(context, n):
            kind = kind_of(prop)
            if open_by_kind.get(kind, 0) < WATCHES_PER_KIND and context:
                self._watches.append(_Watch(kind, len(context), context[-1], list(prop.tokens)))
                open_by_kind[kind] = open_by_kind.get(kind, 0) + 1
            conf, k, value = self._calibrated_best(prop, kind)
            if k == 0 or value < 1.0 + self.margin:
                continue  # a draft that promises less than the margin is mostly estimation noise
            key = (value, prop.match_length)
            if best is None or key > best[:2]:
                best = (value, prop.match_length, prop, conf, k)
        if best is None:
            return Draft(source=self.name)
        _, _, prop, conf, k = best
        probs: list[np.ndarray | None] = [] if params.greedy else [None] * k
        return Draft(
            tokens=prop.tokens[:k],
            probs=probs,
            source=self.name,
            sources=[prop.source] * k,
            confidence=conf[:k],
        )

    def lookup(self, context: list[int], n: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """Lookup is all this drafter does, and it is free."""
        return self.draft(context, n, params, rng)

    def finish(self, context: list[int]) -> None:
        """Remember the finished request (prompt and output) and persist it when a store is attached."""
        self._settle(context)
        self._watches = []  # what a request did not emit says nothing about its proposals
        if not self.learn or not context:
            return
        self.index.add_request(context)
        if self.store is not None:
            forgotten = self.index.forgotten
            self.store.save(self.index, self.carried_calibration(), self.carried_tokens())
            if self.index.forgotten != forgotten:  # the cache was cleared: its calibration is gone too
                self.calibration = {}
                self._set_tokens(())

    def carried_calibration(self) -> list[Cell]:
        """The calibration for the next process: the cells of :data:`CARRIED_SOURCES`, each scaled down to at
        most :data:`CARRIED_TRIALS` trials, its acceptance kept (what
        :class:`localspec.suffix.store.SuffixStore`
        saves after a request)."""
        out: list[Cell] = []
        for ((source, band, unanimous, occurrences), bucket), (reached, accepted) in self.calibration.items():
            if reached <= 0 or source not in CARRIED_SOURCES:
                continue
            kept = min(float(reached), CARRIED_TRIALS)
            share = min(max(accepted / reached, 0.0), 1.0)  # (rounding never pushes a cell out of range)
            out.append((source, band, unanimous, occurrences, bucket, kept, kept * share))
        return out

    def carried_tokens(self) -> list[TokenCell]:
        """The token table for the next request or process: per source of :data:`CARRIED_SOURCES`, the
        :data:`CARRIED_TOKENS` tokens reached most often, all of that source's counts scaled by one factor
        so that they sum to at most :data:`TOKEN_TRIALS` trials (what
        :class:`localspec.suffix.store.SuffixStore`
        saves after a request)."""
        out: list[TokenCell] = []
        for source, table in self.tokens.items():
            reached_all = self.token_totals[source][0]
            if reached_all <= 0 or source not in CARRIED_SOURCES:
                continue
            scale = min(1.0, TOKEN_TRIALS / reached_all)
            rows: Iterable[tuple[int, list[float]]] = table.items()
            if len(table) > CARRIED_TOKENS:
                rows = sorted(rows, key=lambda kv: -kv[1][0])[:CARRIED_TOKENS]
            for token, (reached, accepted) in rows:
                kept = min(reached * scale, float(TOKEN_TRIALS))
                share = min(max(accepted / reached, 0.0), 1.0) if reached > 0 else 0.0
                out.append((source, token, kept, kept * share))
        return out

    def _set_tokens(self, cells: Iterable[TokenCell]) -> None:
        tables: dict[str, dict[int, list[float]]] = {}
        totals: dict[str, list[float]] = {}
        for source, token, reached, accepted in cells:
            tables.setdefault(source, {})[token] = [reached, accepted]
            total = totals.setdefault(source, [0.0, 0.0])
            total[0] += reached
            total[1] += accepted
        self.tokens, self.token_totals = tables, totals

    def overlap(self, context: list[int]) -> float:
        """Fraction of the prompt's recent 4-grams already seen in history, store or corpus (for routing)."""
        return self.index.overlap(context)

    def _calibrated_best(self, prop: Proposal, kind: Kind) -> tuple[list[float], int, float]:
        """The proposal's per-token acceptances through :meth:`calibrated`, and :func:`best_length`'s k and
        value for them: the same arithmetic in one loop (it runs every round), with ``verify_cost`` read
        once per width (a new curve assigned to :attr:`verify_cost` is read afresh)."""
        costs = self._costs
        if self._costs_of is not self.verify_cost:
            self._costs_of, costs = self.verify_cost, []
            self._costs = costs
        confidence = prop.confidence
        if len(costs) < len(confidence) + 2:
            costs.extend(self.verify_cost(b) for b in range(len(costs) + 1, len(confidence) + 3))
        chain = (*lineage_of(kind), kind)
        conf: list[float] = []
        hazard = self._hazard(prop.source)
        if hazard:
            table, w, wr, rate = hazard
            tokens = prop.tokens
        best_k, best = 0, 1.0 / costs[0]
        expected, run = 1.0, 1.0
        n, i = len(confidence), 0
        for bucket, lo, hi in _SEGMENTS:  # the cells change only at bucket edges (7 over 64 positions)
            if lo >= n:
                break
            a, b = self._pull(chain, bucket)
            for c in confidence[lo:hi]:
                i += 1  # the draft length if it ends here
                x = a + b * c
                if hazard:
                    cell = table.get(tokens[i - 1])
                    if cell is not None:
                        x *= (cell[1] + wr) / ((cell[0] + w) * rate)
                        x = x if x < 1.0 else 1.0
                conf.append(x)
                run *= x if 0.0 <= x <= 1.0 else min(max(float(x), 0.0), 1.0)
                expected += run
                value = expected / costs[i]
                if value > best + 1e-12:
                    best_k, best = i, value
        return conf, best_k, best

    # Calibration -----------------------------------------------------------------------------------
    def calibrated(self, kind: Kind, position: int, c: float, token: int | None = None) -> float:
        """The acceptance of a proposal's token at ``position`` given the ones before it were accepted: its
        smoothed frequency ``c`` (discounted by :attr:`prior_trust`) pulled towards what was measured for
        each kind of its :func:`lineage_of` in turn (coarsest first), then towards what was measured for
        its kind, at that position bucket; then, when ``token`` is given, scaled by that token's hazard
        (see the class docstring), at most 1."""
        a, b = self._pull((*lineage_of(kind), kind), _POSITION[min(position, MAX_DRAFT)])
        x = a + b * c
        hazard = self._hazard(kind[0])
        if hazard and token is not None:
            table, w, wr, rate = hazard
            cell = table.get(token)
            if cell is not None:
                x *= (cell[1] + wr) / ((cell[0] + w) * rate)
                x = x if x < 1.0 else 1.0
        return x

    def _hazard(self, source: str) -> tuple[dict[int, list[float]], float, float, float] | None:
        """What a token of ``source`` is scaled by (see the class docstring): its table, w, w r and r, where
        a token's factor is ``(accepted_t + w r) / ((reached_t + w) r)``; None without a table."""
        table = self.tokens.get(source) if self.token_weight > 0 else None
        if not table:
            return None
        w = self.token_weight
        reached_all, accepted_all = self.token_totals[source]
        rate = (accepted_all + 1.0) / (reached_all + 2.0)
        return table, w, w * rate, rate

    def _pull(self, chain: Sequence[Kind], bucket: int) -> tuple[float, float]:
        """(a, b) such that a token of smoothed frequency c is calibrated to ``a + b * c`` at this position
        bucket: ``prior_trust * c`` pulled towards each kind's measured acceptance in turn, ``x ->
        (accepted + w x) / (reached + w)`` with w = :data:`_CALIBRATION_WEIGHT` (affine in x, so the
        chain is one multiply-add per token)."""
        a, b = 0.0, self.prior_trust
        cells, weight = self.calibration, _CALIBRATION_WEIGHT
        for kind in chain:
            reached, accepted = cells.get((kind, bucket), (0, 0))
            share = weight / (reached + weight)
            a, b = accepted / (reached + weight) + share * a, share * b
        return a, b

    def _settle(self, context: Sequence[int]) -> None:
        """Compare every watched proposal with the tokens the target emitted since the last round: each
        position reached counts a trial of (kind, position), accepted while it equals the target's token;
        a watch ends at its first wrong token or its last one. A watch whose context is gone (another
        generation ran in between) is dropped unscored."""
        if not self._watches:
            return
        cells = self.calibration
        n = len(context)
        keep: list[_Watch] = []
        positions, ends = _POSITION, _BUCKET_END
        for w in self._watches:
            at = w.at
            if n < at or context[at - 1] != w.anchor:
                continue
            tokens, start = w.tokens, w.done
            end = n - at if n - at < len(tokens) else len(tokens)
            if start >= end:
                keep.append(w)
                continue
            # the tokens emitted since the last round, compared in C; the first wrong one (if any) by index
            stop = end
            if tokens[start:end] != context[at + start : at + end]:
                stop = start
                while tokens[stop] == context[at + stop]:
                    stop += 1
            # positions start .. stop - 1 were reached and accepted, position stop (when < end) reached
            # and wrong: the counts go to each position's bucket, a run of positions per bucket at once
            reached_to = stop + 1 if stop < end else stop
            i = start
            while i < reached_to:
                bucket = positions[i]
                j = ends[i] if ends[i] < reached_to else reached_to
                hits = (j if j < stop else stop) - i
                for kind in w.kinds:
                    cell = cells.get((kind, bucket))
                    if cell is None:
                        cell = cells[(kind, bucket)] = [0, 0]
                    cell[0] += j - i
                    cell[1] += hits
                i = j
            if self.token_weight > 0:
                source = w.kind[0]
                table = self.tokens.get(source)
                if table is None:
                    table = self.tokens[source] = {}
                    self.token_totals[source] = [0.0, 0.0]
                total = self.token_totals[source]
                total[0] += reached_to - start
                total[1] += stop - start
                for p in range(start, reached_to):
                    cell = table.get(tokens[p])
                    if cell is None:
                        cell = table[tokens[p]] = [0.0, 0.0]
                    cell[0] += 1
                    if p < stop:
                        cell[1] += 1
            w.done = stop
            if stop == end and stop < len(tokens):
                keep.append(w)
        self._watches = keep
