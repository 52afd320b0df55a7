"""The token sequences of one source (the history, the corpus) with the sorted n-gram index over them.

Requests live in one int32 array, separated by ``-1``. New requests go into a small *recent* part (a
sorted merge of two sorted runs, linear), which is merged into the *base* part when it grows past a
quarter of it; the oldest requests are evicted when the history passes its token cap (a filter of sorted
arrays, no re-sort). Memory: 4 bytes per token plus 8 bytes per (token, level), and at most 512 KB per part
for its search directory. A lookup searches the longest level first (usually the answer), then the shorter
ones until one has a verified occurrence; each key is bisected inside its bucket of a small directory of
each part, so that a search touches a few cache lines of the key array instead of missing the cache at
most of its levels, and the newest candidates are verified first, only until there are :data:`MAX_HITS`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np

from localspec.suffix.hashing import EMPTY_PART, TailQuery, build_part, merge_parts

#: At most this many occurrences (the most recent ones) are followed per source and round.
MAX_HITS = 32
#: Up to this many windows are read in Python; more in numpy (one gather).
_PY_WINDOWS = 12


class SourceGroup:
    """Token sequences of one source (history or corpus) with the sorted n-gram index over them."""

    def __init__(self, source: str, merge_at: int = 1 << 16) -> None:
        self.source = source
        self.merge_at = merge_at  # the recent part is merged into the base part past max(this, base / 4)
        self.buf = np.full(1024, -1, dtype=np.int32)
        self.size = 0  # tokens used in buf (requests are followed by a -1)
        self.starts: list[int] = []  # where each request begins in buf
        self.base = EMPTY_PART
        self.recent = EMPTY_PART
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
        part = build_part(self.buf[at : self.size])
        part = (part[0], part[1] + np.int32(at))
        self.recent = merge_parts(self.recent, part) if self.recent[0].size else part
        if self.size - self.recent_from > max(self.merge_at, self.recent_from // 4):
            self.compact()

    def compact(self) -> None:
        """Merge the recent part into the base part."""
        if self.recent[0].size:
            self.base = merge_parts(self.base, self.recent) if self.base[0].size else self.recent
        self.recent = EMPTY_PART
        self.recent_from = self.size

    def withdraw(self, n: int) -> bool:
        """Take the last ``n`` requests back out, as if they had never been added; False (and nothing
        changed) unless they all lie in the recent part. Their tokens are cut from the end of ``buf``
        (refilled with the separator, as a grown buffer is) and their entries (positions from the first
        one's start on) filtered out of the recent part's sorted arrays, which keeps them sorted (no re-sort);
        the base part and its search directory are not touched."""
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

    def occurrences(self, query: TailQuery) -> tuple[int, list[int]]:
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

    def _verified(self, cands: list[int], n: int, query: TailQuery) -> list[int]:
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
        at a merge, the recent one at every request) and kept while the part is the same array."""
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
        self.recent = EMPTY_PART
        self.recent_from = self.size  # everything restored is in the base part
        self.added, self.dropped = len(self.starts), 0
