"""The offline replay of free drafters over recorded requests (localspec.bench.replay)."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.bench.replay import Recorded, any_copy_ceiling, matched, recorded, replay, replay_request
from localspec.decoding.drafters import Draft, NgramDrafter
from localspec.suffix.drafter import SuffixDrafter
from localspec.suffix.index import SuffixIndex


class Fixed:
    """Proposes the same tokens every round (to check the arithmetic)."""

    name = "fixed"
    free = True
    takes_stop_rule = False

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.calls: list[tuple[int, int]] = []
        self.finished: list[int] | None = None

    def begin(self, context: list[int]) -> None:
        self.begun = list(context)

    def draft(self, context: list[int], n: int, params, rng, stop=None) -> Draft:
        self.calls.append((len(context), n))
        return Draft(tokens=self.tokens[:n], source="prompt")

    def use_sequence(self, seq_id):
        pass

    def lookup(self, context, n, params, rng) -> Draft:
        return self.draft(context, n, params, rng)

    def finish(self, context: list[int]) -> None:
        self.finished = list(context)


def test_matched_is_the_greedy_acceptance_rule():
    assert matched([1, 2, 3], [1, 2, 4, 5]) == 2
    assert matched([], [1]) == 0
    assert matched([1, 2], [1]) == 1


def test_rounds_cost_their_verify_width_and_emit_one_more_than_accepted():
    req = Recorded(prompt=(9, 8, 7), output=(1, 2, 5, 1, 2, 3))
    d = Fixed([1, 2, 3])
    r = replay_request(d, req, n_max=3, verify_cost=lambda b: float(b))
    # round 1: draft 1 2 3, truth 1 2 5 -> 2 accepted + the target's 5; round 2: 1 2 3 all accepted and the
    # room (3 tokens left) caps the draft at 2 -> 1 2 accepted + the target's 3
    assert d.begun == [9, 8]
    assert d.calls == [(3, 3), (6, 2)]
    assert (r.rounds, r.tokens, r.drafted, r.accepted) == (2, 6, 5, 4)
    assert r.passes == 4.0 + 3.0
    assert r.runs == [(3, 2), (2, 2)]
    assert d.finished == [9, 8, 7, 1, 2, 5, 1, 2, 3]
    assert abs(r.speedup(0.0) - 6 / 7) < 1e-12


def test_no_draft_is_the_target_alone():
    req = Recorded(prompt=(1, 2), output=(3, 4, 5))
    r = replay_request(Fixed([]), req, n_max=4, verify_cost=lambda b: 1.0 + 0.5 * (b - 1))
    assert (r.rounds, r.passes, r.tokens) == (3, 3.0, 3)
    assert r.speedup(1.0) <= 1.0 and r.acceptance is None


def test_replay_keeps_what_the_suffix_cache_learns_across_requests():
    rng = np.random.default_rng(3)
    answer = [int(t) for t in rng.integers(10, 500, 120)]
    reqs = recorded([{"prompt": [1, 2, 3], "output": answer}, {"prompt": [1, 2, 3], "output": answer}])
    flat = lambda b: 1.0  # noqa: E731 - verifying is free: every proposal is worth drafting
    first = replay_request(
        SuffixDrafter(SuffixIndex(), verify_cost=flat), reqs[0], n_max=16, verify_cost=flat
    )
    both = replay(SuffixDrafter(SuffixIndex(), verify_cost=flat), reqs, n_max=16, verify_cost=flat)
    assert first.accepted == 0  # random tokens: nothing to copy within the first request
    assert both.accepted >= 100  # the second request copies the first
    assert replay(NgramDrafter(), reqs, n_max=16, verify_cost=flat).accepted == 0  # prompt lookup forgets


def test_any_copy_ceiling_copies_the_longest_seen_prefix_and_cuts_where_the_curve_pays():
    def linear(b: int) -> float:
        return 1.0 + 0.1 * (b - 1)

    # 1 2 3 4 was seen (then 5, not the 7 the target emits): one round of 4 drafts, then [1] seen again
    out = any_copy_ceiling([[1, 2, 3, 4, 5, 6]], [Recorded((9,), (1, 2, 3, 4, 7, 1, 2))], linear)
    assert (out.rounds, out.tokens, out.drafted) == (2, 7, 5)
    assert out.passes == pytest.approx(linear(5) + linear(2))
    # nothing seen: only the request's own text; 8 9 repeats from its third token on
    own = any_copy_ceiling([], [Recorded((5,), (8, 9, 8, 9, 8, 9))], linear)
    assert (own.rounds, own.tokens, own.drafted) == (4, 6, 2)
    # a later request copies an earlier one whole (less the last token, which a round always adds)
    both = any_copy_ceiling([], [Recorded((5,), (3, 1, 4, 1)), Recorded((6,), (3, 1, 4, 1))], linear)
    assert both.rounds == 4 + 1 and both.tokens == 8
    # a dearer 5-token pass: the best cut of a 4-token copy is 2 drafts (3 tokens for 2.5 passes)
    dear = {1: 1.0, 2: 2.0, 3: 2.5, 4: 3.5, 5: 6.0}
    cut = any_copy_ceiling([[1, 2, 3, 4, 5]], [Recorded((9,), (1, 2, 3, 4, 7))], lambda b: dear[b])
    assert cut.drafted == 2 and cut.passes == pytest.approx(2.5 + 1.0 + 1.0)
