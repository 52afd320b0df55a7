"""The suffix index against brute force, choose_length by hand, and the drafter through the engine."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from _chi2 import chi2_pvalue
from _lossless import assert_lossless
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec.decoding.draft import SOURCES
from localspec.decoding.stats import GenerationStats
from localspec.llama.sampling import SamplingParams
from localspec.settings import DraftSettings
from localspec.suffix import calibration, confidence, hashing, index
from localspec.suffix import group as groups
from localspec.suffix.confidence import choose_length, linear_verify_cost, smoothed
from localspec.suffix.drafter import SuffixDrafter
from localspec.suffix.group import MAX_HITS
from localspec.suffix.hashing import LEVELS
from localspec.suffix.index import SuffixIndex

GREEDY = SamplingParams()


# choose_length ---------------------------------------------------------------------------------------
def test_choose_length_hand_checked():
    lin = linear_verify_cost
    assert lin(1) == 1.0 and lin(5) == pytest.approx(2.68)
    assert choose_length([], lin) == 0
    # certain tokens on a curve that rewards width: take them all ((k+1)/(1+0.42k) grows with k)
    assert choose_length([1.0] * 8, lin) == 8
    # 0.5 each: k=1 gives 1.5/1.42 = 1.056 > 1; k=2 gives 1.75/1.84 = 0.95
    assert choose_length([0.5, 0.5, 0.5], lin) == 1
    # 0.3: 1.3/1.42 = 0.915 < 1, drafting does not pay
    assert choose_length([0.3, 1.0, 1.0], lin) == 0
    # a weak first token followed by sure ones: k=3 gives (1 + 0.5*3)/1.84*... = 2.5/1.84 = 1.36 > k=1's 1.056
    assert choose_length([0.5, 1.0, 1.0], lin) == 3
    # a step curve: width 3 costs one pass, width 4 costs four -> stop at k=2
    step = {1: 1.0, 2: 1.0, 3: 1.0, 4: 4.0, 5: 5.0}
    assert choose_length([1.0, 1.0, 1.0, 1.0], step.__getitem__) == 2
    # no batching benefit at all (V(b) = b): every length ties with none, and ties go to the shorter
    assert choose_length([1.0, 1.0], float) == 0
    # the EPYC curve from the issue is flat from 12 to 16: with sure tokens 15 beats 11
    epyc = dict(
        zip([1, 2, 4, 8, 12, 16, 24, 32], [1.0, 1.53, 2.44, 4.21, 4.95, 4.64, 7.08, 8.14], strict=True)
    )

    def v(b: int) -> float:
        lo = max(x for x in epyc if x <= b)
        hi = min(x for x in epyc if x >= b)
        return epyc[lo] if lo == hi else epyc[lo] + (epyc[hi] - epyc[lo]) * (b - lo) / (hi - lo)

    assert choose_length([1.0] * 15, v) == 15


def test_smoothing_never_calls_one_sighting_certain():
    assert smoothed(1, 1, 2) < 0.75
    assert smoothed(1, 1, 16) < 1.0
    assert smoothed(1, 1, 16) > smoothed(1, 1, 4) > smoothed(1, 1, 2)  # longer contexts predict better
    assert smoothed(10, 10, 2) > smoothed(1, 1, 2)  # more evidence, more confidence
    assert smoothed(1, 2, 8) < smoothed(2, 2, 8)


# The index against brute force -----------------------------------------------------------------------
def _brute_matches(context, history, corpus, k):
    out = []
    for source, segs in (("prompt", [list(context)]), ("history", history), ("corpus", corpus)):
        for n in reversed(LEVELS):
            if n > len(context):
                continue
            tail = list(context[-n:])
            occ = [(s, p) for s, seg in enumerate(segs) for p in range(n, len(seg)) if seg[p - n : p] == tail]
            if occ:
                windows = [segs[s][p : p + k] for s, p in occ[-MAX_HITS:]]
                out.append((source, n, windows))
                break
    return out


def _brute_walk(windows, k):
    rows = [w for w in windows if w]
    toks, counts = [], []
    for i in range(k):
        col = [r[i] for r in rows if len(r) > i]
        if not col:
            break
        votes = Counter(col)
        last = {t: j for j, t in enumerate(col)}
        tok = max(votes, key=lambda t: (votes[t], last[t]))
        toks.append(tok)
        counts.append((votes[tok], len(col)))
        rows = [r for r in rows if len(r) > i and r[i] == tok]
    return toks, counts


def _kept(requests, cap):
    """Which requests survive the history cap: the oldest go, in batches down to 90% of the cap."""
    kept: list[list[int]] = []
    for r in requests:
        if not r:
            continue
        kept.append(r)
        if sum(map(len, kept)) > cap:
            while kept and sum(map(len, kept)) > int(cap * 0.9):
                kept.pop(0)
    return kept


def _check_against_brute(ix, context, history, corpus, k):
    got = [(m.source, m.length, m.windows) for m in ix.matches(context, k)]
    want = _brute_matches(context, history, corpus, k)
    assert got == want
    props = {p.source: p for p in ix.propose(context, k)}
    for source, n, windows in want:
        toks, counts = _brute_walk(windows, k)
        if not toks:
            assert source not in props
            continue
        p = props[source]
        assert p.tokens == toks and p.counts == counts and p.match_length == n
        assert p.confidence == [smoothed(c, q, n + i) for i, (c, q) in enumerate(counts)]  # to the bit
        assert p.source in SOURCES


seqs = st.lists(st.integers(0, 3), max_size=40)


def _sorted_part(draw_keys: list[int], first_pos: int) -> tuple[np.ndarray, np.ndarray]:
    keys = np.array(draw_keys, dtype=np.uint32)
    order = np.argsort(keys, kind="stable")
    return keys[order], (np.arange(keys.size, dtype=np.int32) + np.int32(first_pos))[order]


@given(
    a=st.lists(st.integers(0, 12), max_size=40),
    b=st.lists(st.integers(0, 12), max_size=40),
    big=st.booleans(),
)
def test_merging_two_parts_is_a_stable_sort_of_both(a, b, big):
    """A few distinct keys, so most keys repeat: ``a``'s positions must stay before ``b``'s within a key."""
    shift = 28 if big else 0  # keys up to the top of the uint32 range
    pa, pb = _sorted_part([k << shift for k in a], 0), _sorted_part([k << shift for k in b], 1000)
    keys, pos = hashing.merge_parts(pa, pb)
    both_keys = np.concatenate([pa[0], pb[0]])
    order = np.argsort(both_keys, kind="stable")
    assert keys.dtype == np.uint32 and pos.dtype == np.int32
    assert keys.tolist() == both_keys[order].tolist()
    assert pos.tolist() == np.concatenate([pa[1], pb[1]])[order].tolist()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=st.lists(seqs, max_size=6),
    corpus=st.lists(seqs, max_size=3),
    prompt=st.lists(st.integers(0, 3), max_size=30),
    output=st.lists(st.integers(0, 3), max_size=12),
    k=st.integers(1, 20),
    merge_at=st.sampled_from([1, 16, 1 << 16]),
    cap=st.sampled_from([25, 60, 10**6]),
)
def test_index_equals_brute_force(history, corpus, prompt, output, k, merge_at, cap):
    ix = SuffixIndex(max_history_tokens=cap, merge_at=merge_at)
    for r in history:
        ix.add_request(r)
    ix.set_corpus(corpus)
    kept = _kept(history, cap)
    corpus = [c for c in corpus if c]
    assert ix.history_tokens == sum(map(len, kept)) and ix.history_requests == len(kept)
    # the current request grows the way the engine grows it: begin on the prompt, then token by token
    ix.begin(prompt)
    context = list(prompt)
    _check_against_brute(ix, context, kept, corpus, k)
    for t in output:
        context.append(t)
        _check_against_brute(ix, context, kept, corpus, k)
    # what a store persists rebuilds the same index
    again = SuffixIndex.from_state(ix.state(), max_history_tokens=cap)
    again.begin(context)
    _check_against_brute(again, context, kept, corpus, k)


@settings(max_examples=100, deadline=None)
@given(
    history=st.lists(seqs, max_size=8),
    n=st.integers(0, 8),
    merge_at=st.sampled_from([1, 16, 40, 1 << 16]),
)
def test_withdrawn_requests_leave_the_index_as_if_never_added(history, n, merge_at):
    """withdraw(n) gives the index that adding all but the last n would have built (the same arrays), or
    refuses and changes nothing when they were merged into the base part."""
    ix = SuffixIndex(merge_at=merge_at)
    for r in history:
        ix.add_request(r)
    before = {k: v.copy() for k, v in ix.state().items()}
    kept = [r for r in history if r]
    n = min(n, len(kept))
    if not ix.withdraw(n):
        assert n == 0 or ix.history.starts[-n] < ix.history.recent_from
        assert all(np.array_equal(before[k], v) for k, v in ix.state().items())
        return
    fresh = SuffixIndex(merge_at=merge_at)
    for r in kept[: len(kept) - n]:
        fresh.add_request(r)
    mine, theirs = ix.state(), fresh.state()
    assert mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)
    assert ix.history_added == fresh.history_added and ix.history_tokens == fresh.history_tokens
    for r in kept[len(kept) - n :]:  # adding them again gives the index before
        ix.add_request(r)
    assert all(np.array_equal(before[k], v) for k, v in ix.state().items())


def test_hash_collisions_never_propose_a_wrong_continuation(monkeypatch):
    """With every n-gram hashing to the same key, only verified occurrences count."""
    monkeypatch.setattr(hashing, "_mix_np", lambda x: np.zeros(x.shape, np.uint32))
    monkeypatch.setattr(hashing, "_mix_py", lambda x: 0)
    rng = np.random.default_rng(1)
    for _ in range(30):
        history = [rng.integers(0, 3, int(rng.integers(0, 9))).tolist() for _ in range(2)]
        ix = SuffixIndex()
        for r in history:
            ix.add_request(r)
        context = rng.integers(0, 3, 10).tolist()
        ix.begin(context)
        _check_against_brute(ix, context, [h for h in history if h], [], 6)


# The lookup's fast paths against the plain search they replaced -------------------------------------
def _plain_keys(tail):
    """Every level's key at once, the way the index hashed its queries before :class:`hashing.TailQuery`."""
    keys, h, power = {}, 0, 1
    for n in range(1, min(len(tail), LEVELS[-1]) + 1):
        h = (h + (int(tail[-n]) + 1) * power) & hashing._M64
        power = (power * hashing._BASE) & hashing._M64
        if n in hashing.SALT:
            keys[n] = hashing._mix_py(h ^ hashing.SALT[n])
    return keys


def _plain_occurrences(group, keys, tail):
    """The plain search: every level's key range in both parts in one numpy call each, the most recent
    4 * MAX_HITS candidates per part verified by a gather, the longest verified level wins. (A candidate
    with fewer than n tokens before it never matches: the gather read it with wrapped indexes.)"""
    levels = [n for n in LEVELS if n in keys]
    if not levels or group.size == 0:
        return 0, []
    q = np.array([keys[n] for n in levels], dtype=np.uint32)
    ranges = []
    for part_keys, part_pos in (group.base, group.recent):
        if part_keys.size:
            ends = np.searchsorted(part_keys, np.concatenate([q, q + np.uint32(1)]))
            ranges.append((part_pos, ends[: len(q)], ends[len(q) :]))
    if not ranges:
        return 0, []
    total = sum(np.maximum(b - a, 0) for _, a, b in ranges)
    for li in np.flatnonzero(total)[::-1].tolist():
        n = levels[li]
        pieces = [p[max(int(a[li]), int(b[li]) - 4 * MAX_HITS) : int(b[li])] for p, a, b in ranges]
        pos = np.concatenate(pieces).astype(np.int64)
        window = group.buf[np.maximum(pos[:, None] + np.arange(-n, 0), 0)]
        pos = pos[(window == np.asarray(tail[-n:], dtype=np.int32)).all(axis=1) & (pos >= n)]
        if pos.size:
            return n, np.unique(pos)[-MAX_HITS:].tolist()
    return 0, []


def _plain_matches(ix, context, k):
    """:meth:`SuffixIndex.matches` as it was: a table per level for the request, the plain search for
    the groups, windows by one gather."""
    out = []
    for n in reversed(LEVELS):
        tail = list(context[-n:])
        hits = [p for p in range(n, len(context)) if list(context[p - n : p]) == tail]
        if n <= len(context) and hits:
            out.append(("prompt", n, [list(context[p : p + k]) for p in hits[-MAX_HITS:]]))
            break
    tail = list(context[-LEVELS[-1] :])
    keys = _plain_keys(tail)
    for group in (ix.history, ix.corpus):
        n, pos = _plain_occurrences(group, keys, tail)
        if n:
            idx = np.minimum(np.asarray(pos)[:, None] + np.arange(k), group.size - 1)
            out.append((group.source, n, [index._until_separator(w) for w in group.buf[idx].tolist()]))
    return out


def _weak_mix_np(x):
    return ((x * np.uint64(hashing._MIX1)) >> np.uint64(61)).astype(np.uint32)


def _weak_mix_py(x):
    return ((x * hashing._MIX1) & hashing._M64) >> 61


def _top_mix_np(x):
    """Eight keys in the directory's last bucket, one of them 0xFFFFFFFF (which no search finds)."""
    return (
        np.uint32(0xFFFFFFFF) - ((x * np.uint64(hashing._MIX1)) >> np.uint64(61)).astype(np.uint32)
    ).astype(np.uint32)


def _top_mix_py(x):
    return 0xFFFFFFFF - (((x * hashing._MIX1) & hashing._M64) >> 61)


_HASHES = {"strong": None, "weak": (_weak_mix_np, _weak_mix_py), "top": (_top_mix_np, _top_mix_py)}


repeats = st.lists(st.integers(0, 2), min_size=0, max_size=300)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=st.lists(repeats, max_size=6),
    corpus=st.lists(repeats, max_size=2),
    context=st.lists(st.integers(0, 2), min_size=2, max_size=200),
    step=st.sampled_from([1, 3, 17]),
    k=st.sampled_from([1, 5, 16, 40]),
    merge_at=st.sampled_from([1, 64, 1 << 16]),
    weak_hash=st.sampled_from(sorted(_HASHES)),
    py_live=st.sampled_from([0, 48, 10**9]),
    py_windows=st.sampled_from([0, 12, 10**9]),
)
def test_lookup_equals_the_plain_search(
    history, corpus, context, step, k, merge_at, weak_hash, py_live, py_windows
):
    """Token streams with many repeats (three token values: long matches, hundreds of occurrences per
    key, more than the candidates a part offers), optionally a hash of eight keys (colliding levels and
    positions, key ranges of thousands of entries), every split of the Python and numpy paths, the
    request growing by one token or by whole drafts, keys at the top of the key range (the last bucket
    of the directory, the key 0xFFFFFFFF): the lookup gives what the plain search gives."""
    with pytest.MonkeyPatch.context() as mp:
        if _HASHES[weak_hash]:
            mp.setattr(hashing, "_mix_np", _HASHES[weak_hash][0])
            mp.setattr(hashing, "_mix_py", _HASHES[weak_hash][1])
        mp.setattr(index, "_PY_LIVE", py_live)
        mp.setattr(groups, "_PY_WINDOWS", py_windows)
        ix = SuffixIndex(merge_at=merge_at)
        for r in history:
            ix.add_request(r)
        ix.set_corpus(corpus)
        start = max(2, len(context) // 2)
        ix.begin(context[:start])
        for end in [*range(start, len(context), step), len(context)]:
            got = [(m.source, m.length, m.windows) for m in ix.matches(context[:end], k)]
            assert got == _plain_matches(ix, context[:end], k)


@pytest.mark.parametrize("weak_hash", [False, True])
def test_lookup_equals_the_plain_search_on_long_repetitive_streams(monkeypatch, weak_hash):
    """The same at a scale hypothesis does not reach: thousands of occurrences per key in both parts,
    so only the most recent candidates of each part are looked at, with drafts accepted whole."""
    if weak_hash:
        monkeypatch.setattr(hashing, "_mix_np", _weak_mix_np)
        monkeypatch.setattr(hashing, "_mix_py", _weak_mix_py)
    rng = np.random.default_rng(7)
    motif = rng.integers(0, 50, 40)
    ix = SuffixIndex(merge_at=3000)
    for _ in range(8):  # requests that repeat a motif with mutations, over few token values
        r = np.tile(motif, 50)[: int(rng.integers(1000, 2000))]
        flip = rng.random(r.size) < 0.05
        r[flip] = rng.integers(0, 3, int(flip.sum()))
        ix.add_request(r.tolist())
    assert ix.history.base[0].size and ix.history.recent[0].size
    for trial in range(6):
        context = np.tile(motif, 20)[: int(rng.integers(100, 600))]
        flip = rng.random(context.size) < 0.1
        context[flip] = rng.integers(0, 3, int(flip.sum()))
        context = context.tolist()
        ix.begin(context[:50])
        for end in range(50, len(context), 1 + trial * 3):
            got = [(m.source, m.length, m.windows) for m in ix.matches(context[:end], 16)]
            assert got == _plain_matches(ix, context[:end], 16)


def test_lookup_over_arrays_of_the_other_byte_order():
    """A store's arrays are little-endian on disk; where that is not the machine's order (or an index is
    restored from such arrays) the lookup reads native copies and gives the same answers."""
    rng = np.random.default_rng(5)
    ix = SuffixIndex()
    for _ in range(4):
        ix.add_request(rng.integers(0, 5, 300).tolist())
    swapped = {k: v.astype(v.dtype.newbyteorder("S")) for k, v in ix.state().items()}
    assert not swapped["history_keys"].dtype.isnative
    again = SuffixIndex.from_state(swapped)
    for _ in range(20):
        context = rng.integers(0, 5, 40).tolist()
        ix.begin(context)
        again.begin(context)
        assert again.propose(context, 8) == ix.propose(context, 8) and ix.propose(context, 8)


def test_lookup_survives_colliding_levels_near_the_start(monkeypatch):
    """A key shared by every level puts short-context positions in a long level's range: they never
    match (the gather this lookup replaced raised IndexError on them once a store had been loaded: its
    buffer is then no longer than its tokens)."""
    monkeypatch.setattr(hashing, "_mix_np", lambda x: np.zeros(x.shape, np.uint32))
    monkeypatch.setattr(hashing, "_mix_py", lambda x: 0)
    history = [1, 2, 1, 2, 1, 2, 1]
    ix = SuffixIndex()
    ix.add_request(history)
    ix = SuffixIndex.from_state(ix.state())
    assert ix.history.buf.size == len(history) + 1
    context = [5, 6, 7, 8, 9, *[1, 2] * 5, 1]
    ix.begin(context)
    _check_against_brute(ix, context, [history], [], 4)
    assert [(m.source, m.length) for m in ix.matches(context, 4)] == [("prompt", 8), ("history", 4)]


def test_drafter_calibration_and_length_equal_the_public_functions():
    """The drafter's one-loop calibration and best length give bit for bit what :meth:`calibrated` and
    :func:`best_length` give, and a new cost curve assigned to ``verify_cost`` is read afresh."""
    rng = np.random.default_rng(3)
    tokens = []
    for source in ("prompt", "history"):
        for token in range(0, 20, 2):  # odd tokens have no cell: their factor is 1
            reached = float(rng.integers(1, 60))
            tokens.append((source, token, reached, float(rng.integers(0, reached + 1))))
    for d in (SuffixDrafter(), SuffixDrafter(tokens=tokens), SuffixDrafter(tokens=tokens, token_weight=0)):
        kinds = [("prompt", 4, True, 0), ("history", 2, False, 1), ("history", 4, True, 2)]
        for kind in kinds:
            for b in range(7):
                reached = int(rng.integers(0, 50))
                d.calibration[(kind, b)] = [reached, int(rng.integers(0, reached + 1))]
        for curve in (linear_verify_cost, lambda b: 1.0 + 0.05 * (b - 1) ** 1.5, lambda b: float(b)):
            d.verify_cost = curve
            for _ in range(200):
                conf = rng.uniform(0, 1, int(rng.integers(0, 40))).tolist()
                kind = kinds[int(rng.integers(0, 3))]
                toks = rng.integers(0, 20, len(conf)).tolist()
                prop = index.Proposal(kind[0], 4, toks, conf)
                want = [d.calibrated(kind, i, c, t) for i, (c, t) in enumerate(zip(conf, toks, strict=True))]
                assert d._calibrated_best(prop, kind) == (want, *confidence.best_length(want, curve))
    # the token factor is applied where a table is on: tokens rejected more often than their source
    # are trusted less, and never above 1
    d = SuffixDrafter(tokens=[("prompt", 7, 30.0, 3.0), ("prompt", 8, 30.0, 30.0)])
    kind = ("prompt", 4, True, 0)
    plain = d.calibrated(kind, 0, 0.9)
    assert d.calibrated(kind, 0, 0.9, 7) < 0.5 * plain < plain == d.calibrated(kind, 0, 0.9, 9)
    assert plain < d.calibrated(kind, 0, 0.9, 8) <= 1.0
    assert SuffixDrafter(tokens=d.carried_tokens(), token_weight=0).calibrated(kind, 0, 0.9, 7) == plain


def test_kind_of_a_proposal():
    p = index.Proposal("history", 16, [5, 6], [0.9, 0.9], [(3, 3), (3, 3)])
    assert calibration.kind_of(p) == ("history", 4, True, 1)
    p = index.Proposal("prompt", 2, [5], [0.5], [(1, 2)])
    assert calibration.kind_of(p) == ("prompt", 0, False, 1)
    p = index.Proposal("corpus", 9, [5], [0.5], [(5, 5)])
    assert calibration.kind_of(p) == ("corpus", 2, True, 2)
    assert calibration.POSITION_BAND[:9] == (0, 1, 2, 2, 3, 3, 3, 3, 4) and calibration.POSITION_BAND[-1] == 6


def test_tokens_outside_the_vocabulary_are_never_proposed():
    ix = SuffixIndex(n_vocab=100)
    ix.add_request([1, 2, 3, 4, 5, 500, 6])
    ix.begin([9, 1, 2, 3])
    (p,) = ix.propose([9, 1, 2, 3], 8)
    assert p.tokens == [4, 5]


def test_overlap_is_the_fraction_of_recent_ngrams_seen_before():
    ix = SuffixIndex()
    assert ix.overlap(list(range(50))) == 0.0
    ix.add_request(list(range(100)))
    assert ix.overlap(list(range(10, 60))) == 1.0
    assert ix.overlap(list(range(1000, 1050))) == 0.0
    half = list(range(20, 40)) + list(range(1000, 1020))
    assert 0.3 < ix.overlap(half) < 0.6
    corpus_only = SuffixIndex()
    corpus_only.set_corpus([list(range(500, 600))])
    assert corpus_only.overlap(list(range(510, 540))) == 1.0


# The drafter ---------------------------------------------------------------------------------------
def test_drafter_fills_sources_confidence_and_sampling_probs():
    d = SuffixDrafter(prior_trust=1.0)  # the discounted prior has its own tests
    rng = np.random.default_rng(0)
    d.finish(list(range(10, 60)))
    ctx = [1, 2, *range(10, 26)]  # a 16-token match: sure enough for a long draft
    d.begin(ctx[:-1])
    greedy = d.draft(ctx, 8, GREEDY, rng)
    assert greedy.tokens == list(range(26, 34)) and greedy.sources == ["history"] * 8
    assert len(greedy.confidence) == 8 and all(0.9 < c < 1 for c in greedy.confidence)
    assert greedy.probs == []
    sampled = d.draft(ctx, 3, SamplingParams(temperature=0.8, seed=1), rng)
    assert sampled.tokens == [26, 27, 28] and sampled.probs == [None, None, None]
    assert d.lookup(ctx, 3, GREEDY, rng).tokens == [26, 27, 28]
    assert d.draft(ctx, 0, GREEDY, rng).tokens == []
    # a short match seen once is worth a short draft only
    short = d.draft([1, 2, 10, 11, 12], 8, GREEDY, rng)
    assert short.tokens == [13, 14]
    # an unseen context drafts nothing
    assert d.draft([1, 2, 77, 78, 79], 8, GREEDY, rng).tokens == []


def test_drafter_learns_acceptance_per_kind_and_position():
    d = SuffixDrafter(prior_trust=1.0)  # the discounted prior has its own tests
    rng = np.random.default_rng(0)
    d.finish(list(range(10, 60)))
    ctx = [1, *range(10, 26)]
    d.begin(ctx[:-1])
    draft = d.draft(ctx, 6, GREEDY, rng)
    assert draft.tokens == [26, 27, 28, 29, 30, 31]
    kind = ("history", 4, True, 0)
    # the target accepted two drafts and emitted its own third token: positions 0 and 1 were reached and
    # accepted, position 2 reached and rejected (the watch of this round's proposal then ends)
    d.draft([*ctx, 26, 27, 99], 6, GREEDY, rng)
    assert d.calibration == {(kind, 0): [1, 1], (kind, 1): [1, 1], (kind, 2): [1, 0]}
    # many rejections at the first position pull its acceptance down; later positions keep theirs
    d.calibration[(kind, 0)] = [100, 0]
    raw = draft.confidence[0]
    assert d.calibrated(kind, 0, raw) < 0.2 < 0.8 < d.calibrated(kind, 1, raw)


def test_choose_length_decides_the_draft_length():
    d = SuffixDrafter(verify_cost=lambda b: 1.0 + 5.0 * (b - 1))  # width never pays
    d.finish(list(range(10, 40)))
    d.begin([10, 11, 12])
    assert d.draft([10, 11, 12, 13], 8, GREEDY, np.random.default_rng(0)).tokens == []
    cheap = SuffixDrafter(verify_cost=lambda b: 1.0)  # free width: take everything offered
    cheap.finish(list(range(10, 40)))
    cheap.begin([10, 11, 12])
    assert len(cheap.draft([10, 11, 12, 13], 8, GREEDY, np.random.default_rng(0)).tokens) == 8


# This machine's measured verify curve (Qwen 1.5B, 2 threads): a 2-token pass costs two single ones.
STEEP = {1: 1.0, 2: 2.01, 3: 2.79, 4: 3.47, 5: 4.17, 6: 4.85, 7: 6.0, 8: 7.19}


def _steep(b: int) -> float:
    return STEEP.get(b, 1.0 + 0.9 * (b - 1))


def _run_rounds(d: SuffixDrafter, ctx: list[int], target: list[int], rounds: int, n: int = 8) -> list[int]:
    """Drive ``d`` like the engine does with a greedy target that emits ``target`` in order: the accepted
    draft prefix plus the target's own next token each round. Returns the draft length of each round."""
    lengths = []
    rng = np.random.default_rng(0)
    ctx = list(ctx)
    for _ in range(rounds):
        done = len(ctx)
        if done >= len(target):
            break
        got = d.draft(ctx, n, GREEDY, rng).tokens
        lengths.append(len(got))
        m = 0
        while m < len(got) and done + m < len(target) and got[m] == target[done + m]:
            m += 1
        ctx = target[: done + m + 1]
    return lengths


def test_an_unproven_source_drafts_only_after_free_evidence():
    """On a steep verify curve one earlier occurrence is not enough to pay a wide pass: the drafter holds
    back, scores its proposals against the target's own tokens for free, and drafts once they were right."""
    text = list(range(100, 400))
    d = SuffixDrafter(verify_cost=_steep)
    d.finish(text)  # the target will write the same text again: every proposal is right
    d.begin(text[:20])
    lengths = _run_rounds(d, text[:21], text, 120)
    assert lengths[0] == 0, "drafted on the raw count alone"
    first = next(i for i, n in enumerate(lengths) if n)
    assert 3 <= first <= 40, lengths
    assert sum(lengths[first:]) > 0.5 * (len(text) - 21 - first)  # then it drafts most of the rest
    trials = sum(t for t, _ in d.calibration.values())
    assert trials >= first  # the held-back rounds were scored


def test_a_source_that_is_wrong_never_drafts_on_a_steep_curve():
    history = list(range(100, 400))
    d = SuffixDrafter(verify_cost=_steep)
    d.finish(history)
    # every pair of tokens was seen before, followed by another token than the target writes now
    target = [t for i in range(0, 240, 3) for t in (history[i], history[i + 1], 5000 + i)]
    d.begin(target[:20])
    # the proposals held back are scored (and fail); nothing is drafted
    assert sum(_run_rounds(d, target[:21], target, 150)) == 0
    assert sum(a for _, a in d.calibration.values()) < sum(t for t, _ in d.calibration.values())


def test_watched_proposals_are_scored_token_by_token_as_the_target_emits():
    d = SuffixDrafter(verify_cost=_steep)
    d.finish(list(range(10, 60)))
    ctx = [1, 2, *range(10, 20)]
    d.begin(ctx[:-1])
    assert d.draft(ctx, 4, GREEDY, np.random.default_rng(0)).tokens == []  # held back, watched
    kind = ("history", 2, True, 0)  # a 10-token match seen once
    d.draft([*ctx, 20], 4, GREEDY, np.random.default_rng(0))  # its first token came true; a second watch
    assert d.calibration == {(kind, 0): [1, 1]}
    d.draft([*ctx, 20, 21, 99], 4, GREEDY, np.random.default_rng(0))  # then 21 right, 99 instead of 22
    # first watch [20, 21, 22, 23]: positions 1 (right) and 2 (wrong); second [21, 22, ...]: 0 and 1
    assert d.calibration == {(kind, 0): [2, 2], (kind, 1): [2, 1], (kind, 2): [1, 0]}
    assert len(d._watches) <= 1  # only the proposal of the last round is still open
    # a watch whose context is gone (another generation ran in between) is dropped unscored
    d.draft([*ctx, 20, 21, 99], 4, GREEDY, np.random.default_rng(0))
    before = {k: list(v) for k, v in d.calibration.items()}
    d.draft([7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7], 4, GREEDY, np.random.default_rng(0))
    assert d.calibration == before and all(w.at == 16 for w in d._watches)  # only its own new ones
    d.finish([*ctx, 20, 21, 99, 5])
    assert d._watches == []


def test_copies_that_run_long_are_drafted_long():
    """A target that copies an earlier answer but changes a token every 80: the proposal made right after a
    change is often wrong, while one that has started copying runs to the next change. Learnt per position,
    the drafter drafts long once a copy has started (a per-token rate would average the two)."""
    history = list(range(1000, 1600))
    target = [t if (i + 1) % 80 else 5000 + i for i, t in enumerate(history)]
    d = SuffixDrafter(verify_cost=lambda b: 1.0 + 0.25 * (b - 1))
    d.finish(history)
    d.begin(target[:20])
    lengths = _run_rounds(d, target[:21], target, 600, n=32)
    late = [n for n in lengths[len(lengths) // 2 :] if n]
    assert late and max(late) >= 14 and sum(late) / len(late) >= 8, lengths
    # what it learnt: a proposal after a long match runs on; the first tokens after a change are unproven
    long_match = [v for (kind, pos), v in d.calibration.items() if kind[1] == 4 and pos >= 3]
    assert sum(a for _, a in long_match) / sum(t for t, _ in long_match) > 0.95


def _drafted_and_accepted(
    d: SuffixDrafter, target: list[int], start: int, n: int = 32
) -> list[tuple[int, int]]:
    """Like :func:`_run_rounds`, returning (drafted, accepted) per round."""
    out = []
    rng = np.random.default_rng(0)
    ctx = target[:start]
    while len(ctx) < len(target):
        got = d.draft(ctx, n, GREEDY, rng).tokens
        done, m = len(ctx), 0
        while m < len(got) and done + m < len(target) and got[m] == target[done + m]:
            m += 1
        out.append((len(got), m))
        ctx = target[: done + m + 1]
    return out


def test_a_token_where_copies_break_is_learnt_and_no_longer_drafted_through():
    """A target that copies an earlier text but rewrites every occurrence of one token (77): the drafter
    learns from its watches that 77 is where this copy breaks (its source's other tokens hold), and stops
    its drafts before it instead of paying wide passes for the tokens behind it. Without the token table
    (``token_weight=0``) the break falls at a different position each time and is never learnt."""
    history = [77 if i % 25 == 24 else 1000 + i for i in range(800)]
    target = [5000 + i if t == 77 else t for i, t in enumerate(history)]
    wasted = {}
    for weight in (0.0, calibration.TOKEN_WEIGHT):
        d = SuffixDrafter(verify_cost=lambda b: 1.0 + 0.25 * (b - 1), token_weight=weight)
        d.finish(history)
        d.begin(target[:20])
        rounds = _drafted_and_accepted(d, target, 21)
        late = rounds[len(rounds) // 2 :]
        wasted[weight] = sum(k - m for k, m in late) / max(1, sum(m for _, m in late))
        if weight:
            reached, accepted = d.tokens["history"][77]
            assert reached >= 10 and accepted == 0
            others = [c for t, c in d.tokens["history"].items() if t != 77]
            assert sum(c[1] for c in others) / sum(c[0] for c in others) > 0.95
        else:
            assert d.tokens == {}
    assert wasted[calibration.TOKEN_WEIGHT] < 0.5 * wasted[0.0], wasted


def test_the_token_table_is_kept_from_request_to_request_forgetting_slowly(monkeypatch):
    """A request starts from :meth:`carried_tokens` of the last one, as a new process starts from what the
    store saved: the prompt's table scaled down to at most TOKEN_TRIALS trials in all (its rates kept) and
    to its CARRIED_TOKENS most-reached tokens; the history's and corpus' tables are learnt afresh."""
    monkeypatch.setattr(calibration, "TOKEN_TRIALS", 100)
    monkeypatch.setattr(calibration, "CARRIED_TOKENS", 3)
    cells = [("prompt", t, float(10 * t), float(5 * t)) for t in range(1, 6)]  # 150 trials, 5 tokens
    cells += [("corpus", 9, 8.0, 2.0), ("history", 9, 8.0, 8.0)]
    d = SuffixDrafter(SuffixIndex(), tokens=cells)
    assert d.token_totals == {"prompt": [150.0, 75.0], "corpus": [8.0, 2.0], "history": [8.0, 8.0]}
    carried = {(s, t): (r, a) for s, t, r, a in d.carried_tokens()}
    scale = 100 / 150
    assert carried == {
        ("prompt", t): (pytest.approx(10 * t * scale), pytest.approx(5 * t * scale)) for t in (3, 4, 5)
    }
    assert calibration.token_cells_from(
        list(map(list, d.carried_tokens())), n_vocab=10
    )  # it loads what it saves
    d.begin([1, 2, 3])  # a new request starts from the carry: the same as a new process would
    assert sorted(d.tokens["prompt"]) == [3, 4, 5] and d.token_totals["prompt"][0] == pytest.approx(80.0)
    assert set(d.tokens) == {"prompt"}  # how closely this request follows history or corpus: learnt afresh
    # and what a request learns stays for the next one (begin() does not start the table afresh)
    d.tokens["prompt"][3][0] += 1
    d.begin([4, 5])
    assert 3 in d.tokens["prompt"]


@pytest.mark.parametrize(
    "row",
    [["prompt", 5, 2.0, 3.0], ["prompt", 10, 1, 0], ["x", 5, 1, 0], ["prompt", 5, float("inf"), 0], "prompt"],
)
def test_token_cells_out_of_range_are_refused(row):
    with pytest.raises(ValueError, match="token cell 0"):
        calibration.token_cells_from([row], n_vocab=10)


def test_a_flat_verify_curve_drafts_at_once_despite_the_discounted_prior():
    d = SuffixDrafter(verify_cost=lambda b: 1.0)
    d.finish(list(range(10, 60)))
    d.begin([1, 2, 10, 11, 12])
    assert d.draft([1, 2, 10, 11, 12, 13], 4, GREEDY, np.random.default_rng(0)).tokens == [14, 15, 16, 17]


# Through the real engine on the embedded pair ----------------------------------------------------------
PROMPTS = [
    "import os\n\n\ndef read_lines(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
]


def _run(pipe, tokens, drafter, *, max_tokens=48, params=GREEDY, n_max=16):
    engine = pipe._engine
    engine.trace = []
    stats = GenerationStats(strategy="suffix" if drafter else "none")
    try:
        out = [
            r.token
            for r in engine.stream(
                tokens,
                drafter=drafter,
                max_tokens=max_tokens,
                params=params,
                settings=DraftSettings(strategy="suffix" if drafter else "none", n_max=n_max),
                stats=stats,
            )
        ]
        trace = engine.trace
    finally:
        engine.trace = None
    return SimpleNamespace(tokens=out, stats=stats), trace


def test_greedy_is_lossless_with_suffix_drafts(embedded_pipe):
    drafter = SuffixDrafter(SuffixIndex(n_vocab=embedded_pipe.target.n_vocab))
    from_history = 0
    for prompt in PROMPTS:
        tokens = embedded_pipe.tokenize(prompt)
        base, bt = _run(embedded_pipe, tokens, None, max_tokens=32)
        for _ in range(2):  # the second time the history holds the first answer
            before = drafter.index.history_requests
            spec, st_ = _run(embedded_pipe, tokens, drafter, max_tokens=32)
            if drafter.index.history_requests == before:  # until the engine calls finish() itself
                drafter.finish([*tokens, *spec.tokens])
            assert_lossless(base, bt, spec, st_)
        assert spec.stats.drafted > 0, "no draft was proposed: the test would prove nothing"
        from_history += spec.stats.accepted
    assert from_history > 0
    assert any(kind[0] == "history" for kind, _ in drafter.calibration)


def _first_two(pipe, tokens, n, drafter=None):
    out = []
    for seed in range(n):
        params = SamplingParams(temperature=1.0, seed=seed)
        if drafter is not None:
            drafter.learn = False  # keep the history fixed: every sample sees the same drafter
        r, _ = _run(pipe, tokens, drafter, max_tokens=2, params=params, n_max=3)
        out.append(tuple(r.tokens[:2]))
    return out


def _primed_drafter(pipe, prompt: str) -> tuple[list[int], SuffixDrafter]:
    tokens = pipe.tokenize(prompt)
    # margin 0: keep drafting however the calibration moves (this checks the distribution, not the policy)
    d = SuffixDrafter(SuffixIndex(n_vocab=pipe.target.n_vocab), verify_cost=lambda b: 1.0, margin=0.0)
    # an earlier request that continued this prompt some way: its continuation is what gets drafted
    d.index.add_request([*tokens, *pipe.tokenize(" d\na = b")[1:]])
    return tokens, d


@pytest.mark.slow
def test_sampling_distribution_matches_target_with_suffix_drafts(embedded_pipe, monkeypatch):
    """Chi-square of the first two sampled tokens: target alone vs suffix drafts (the rejection rule
    keeps the target's distribution), and the same check catching a sampler that accepts every draft."""
    n = 300  # measured at 400: p = 0.32 for the real engine, 1e-90 for the biased one
    tokens, d = _primed_drafter(embedded_pipe, "a = b\nc = d\na = b\nc =")
    base = _first_two(embedded_pipe, tokens, n)
    spec = _first_two(embedded_pipe, tokens, n, d)
    assert len(set(base)) > 5, "the distribution is too peaked for the test to mean anything"
    assert chi2_pvalue(base, spec) > 1e-3
    monkeypatch.setattr("localspec.decoding.accept.accept_or_resample", lambda p, q, tok, rng: (True, tok))
    biased = _first_two(embedded_pipe, tokens, n, d)
    assert chi2_pvalue(base, biased) < 1e-3


def test_every_request_starts_from_what_a_new_process_would():
    """What one request learnt of history and corpus copies is not carried to the next request of the same
    process, and the prompt's cells are scaled down as a store carries them: a server's second request
    drafts like the command line's, which loads the store afresh."""
    d = SuffixDrafter()
    d.finish(list(range(10, 60)))
    d.calibration = {
        (("history", 4, True, 0), 0): [100.0, 90.0],
        (("corpus", 3, False, 1), 2): [10.0, 1.0],
        (("prompt", 4, True, 0), 0): [200.0, 150.0],
        (("prompt", 2, True, 0), 1): [8.0, 8.0],
    }
    fresh = SuffixDrafter(d.index, calibration=d.carried_calibration())
    d.begin([1, 2, 3])
    fresh.begin([1, 2, 3])
    assert (
        d.calibration
        == fresh.calibration
        == {
            (("prompt", 4, True, 0), 0): [64.0, 48.0],
            (("prompt", 2, True, 0), 1): [8.0, 8.0],
        }
    )


def test_generations_at_once_each_learn_from_their_own_rounds():
    """Two generations drafting in turn (a batch) through drafters of their own over one cache: each one's
    proposals are scored against its own context. Through one shared drafter every watch was dropped as
    "another generation ran in between": nothing was learnt, and the calibrated drafts shrank to nothing."""
    rng, params = np.random.default_rng(0), SamplingParams()
    cache = SuffixDrafter(SuffixIndex(n_vocab=200))
    texts = [list(range(1, 60)), list(range(100, 160))]
    for text in texts:
        cache.index.add_request(text)
    mine = [cache.for_request(), cache.for_request()]
    contexts = [text[:10] for text in texts]
    for drafter, ctx in zip(mine, contexts, strict=True):
        drafter.begin(ctx)
    for _ in range(8):
        for drafter, ctx, text in zip(mine, contexts, texts, strict=True):
            n = len(drafter.draft(ctx, 8, params, rng).tokens)
            ctx.extend(text[len(ctx) : len(ctx) + n + 1])  # the draft accepted, and the target's token
    for drafter, ctx in zip(mine, contexts, strict=True):
        assert sum(cell[0] for cell in drafter.calibration.values()) > 0  # its watches were scored
        assert ctx[-1] > ctx[9] + 20  # drafts carried it well past one token a round
        drafter.finish(ctx)
    assert cache.index.history_requests == 4 and cache.calibration is mine[1].calibration
