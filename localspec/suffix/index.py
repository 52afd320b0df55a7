"""The suffix index: the longest earlier occurrences of the context's suffix, and their continuation.

:class:`SuffixIndex` looks in three places: the current request (prompt and output so far; source
``"prompt"``), every earlier request of this process and the persisted store (``"history"``), and an
indexed corpus of the user's files (``"corpus"``). The history and the corpus are each a :class:`SourceGroup`
(sorted n-gram keys, see :mod:`localspec.suffix.group`); the current request, which changes every round,
is a plain dict from each pair of tokens to the positions that follow it, and a lookup extends the
candidates of the last pair backwards to their match lengths. :func:`walk` follows the occurrences
forward to a :class:`Proposal`, with a confidence per token (:mod:`localspec.suffix.confidence`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localspec.suffix.confidence import MAX_DRAFT, PRIORS, SMOOTHING, prior, unanimous
from localspec.suffix.group import MAX_HITS, SourceGroup
from localspec.suffix.hashing import LEVELS, MIN_MATCH, SALT, TailQuery, build_part, int32_bytes, tail_keys

#: How far back a match of the longest level is followed (:attr:`Match.extent`): a proposal after a 64-token
#: match is a copy under way, and runs longer than one after a 16-token match
#: (docs/archive/bench-notebook.md).
EXTENTS: tuple[int, ...] = (32, 64)
#: Live-request candidates whose match length is measured in Python; more in numpy.
_PY_LIVE = 48
#: The longest level at most n tokens long, by n (0: none).
_LEVEL_AT = [max((lv for lv in LEVELS if lv <= n), default=0) for n in range(LEVELS[-1] + 1)]
_BACK = np.arange(1, LEVELS[-1] + 1)


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
        self.history = SourceGroup("history", merge_at)
        self.corpus = SourceGroup("corpus")
        self._live: list[int] = []
        # (a, b) -> the positions p with live[p-2:p] == [a, b], ascending
        self._live_pairs: dict[tuple[int, int], list[int]] = {}
        self._live_indexed = 0
        self._live_arr = np.zeros(0, np.int64)  # a copy of _live[:_live_copied], for many candidates
        self._live_copied = 0
        #: how many times this index was told to :meth:`forget` (a drafter forgets what it learnt then too)
        self.forgotten = 0

    def request_view(self) -> SuffixIndex:
        """An index over this one's history and corpus (the same objects: what is added to them shows in
        both) with current-request tables of its own: one generation's, so that generations running at once
        do not overwrite each other's (:meth:`SuffixDrafter.for_request`)."""
        view = copy.copy(self)
        view._live, view._live_pairs, view._live_indexed = [], {}, 0
        view._live_arr, view._live_copied = np.zeros(0, np.int64), 0
        return view

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
        group = SourceGroup("corpus")
        parts = [np.asarray(d, dtype=np.int32) for d in documents]
        parts = [p for p in parts if p.size]
        if parts:
            sep = np.array([-1], dtype=np.int32)
            flat = np.concatenate([x for p in parts for x in (p, sep)])
            group.buf = flat
            group.size = int(flat.size)
            group.starts = list(np.concatenate([[0], np.cumsum([p.size + 1 for p in parts])[:-1]]).tolist())
            group.base = build_part(flat)
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
        query = TailQuery(list(map(int, context[-LEVELS[-1] :])))
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
        if tail.size < n or n not in SALT:
            return 0.0
        want = tail_keys(tail, n)
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
    is a list of tokens or a group's tokens as bytes (:meth:`SourceGroup.views`: slices compare in C). Newest
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
            want, scale = int32_bytes(want), 4
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
            confidence.extend(unanimous(c)[at : at + same])
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
            p = PRIORS[at] if at < len(PRIORS) else prior(at)
            confidence.append((most + SMOOTHING * p) / (len(col) + SMOOTHING))  # smoothed(), from the table
            rows = [r for r in rows if r[i] == tok]
            i += 1
        rows = [r for r in rows if len(r) > i]  # occurrences that end leave the path
    return Proposal(match.source, match.length, tokens, confidence, counts, max(match.extent, match.length))
