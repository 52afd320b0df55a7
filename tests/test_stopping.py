"""Where a draft-model draft stops (localspec.decoding.stopping): the calibration of acceptance by the draft's
confidence, and the expected-gain rule under flat and steep verify costs."""

from __future__ import annotations

import pytest

from localspec.decoding.adaptive import AdaptiveLength
from localspec.decoding.stopping import PRIOR_WEIGHT, AcceptanceByConfidence, GainStop


def test_calibration_starts_at_the_draft_s_word_and_learns_what_the_target_accepts():
    cal = AcceptanceByConfidence()
    assert cal.acceptance(0.99) > cal.acceptance(0.55) > cal.acceptance(0.1)
    assert cal.acceptance(0.85) == pytest.approx(0.85)
    for _ in range(100):  # an over-confident draft: 0.85 tokens accepted half the time
        cal.record(0.85, True)
        cal.record(0.85, False)
    assert cal.acceptance(0.85) == pytest.approx(0.5, abs=0.02)
    assert cal.acceptance(0.99) == pytest.approx(0.99)  # other buckets keep their own counts
    hi, rate, seen = cal.table()[cal.bucket(0.85)]
    assert hi == 0.9 and rate == pytest.approx(0.5, abs=0.02) and seen == pytest.approx(200 - PRIOR_WEIGHT)


def test_a_round_counts_only_the_drafts_judged_on_the_true_context():
    cal = AcceptanceByConfidence()
    cal.record_round([0.99, 0.99, 0.1, 0.1], accepted=1)  # draft 1 rejected; drafts 2, 3 never judged
    b99, b10 = cal.bucket(0.99), cal.bucket(0.1)
    assert cal.seen[b99] == PRIOR_WEIGHT + 2 and cal.seen[b10] == PRIOR_WEIGHT
    assert cal.hits[b99] == pytest.approx(PRIOR_WEIGHT * (0.98 + 1.0) / 2 + 1)


def _stop(slope: float, step: float, cal: AcceptanceByConfidence | None = None) -> GainStop:
    return GainStop(
        cal or AcceptanceByConfidence(),
        verify_seconds=lambda w: 1.0 + slope * (w - 1),
        first_seconds=step,
        step_seconds=step,
    )


def _length(stop: GainStop, confidences: list[float]) -> int:
    """How many drafts the rule keeps from a run of confidences (as ModelDrafter.draft asks it)."""
    for i, c in enumerate(confidences):
        if not stop.keep(i, c):
            return i
        if i + 1 < len(confidences) and not stop.go_on():
            return i + 1
    return len(confidences)


def test_a_flat_verify_curve_and_cheap_draft_tokens_draft_long():
    # a big target: a draft call costs 0.1 of a target pass, a verify row 2%
    assert _length(_stop(slope=0.02, step=0.1), [0.99] * 16) >= 12


def test_dear_rows_and_dear_draft_tokens_draft_short():
    # a small target on a CPU: each verify row 40% of a pass, a draft call half a pass
    n = _length(_stop(slope=0.4, step=0.5), [0.99] * 16)
    assert 1 <= n <= 4


def test_an_unsure_token_ends_the_draft_that_a_fixed_cut_off_would_pass_or_stop_too_early():
    # an unsure token is still worth a row that costs 2% of a pass, but not a draft call after it
    assert _length(_stop(slope=0.02, step=0.1), [0.95, 0.95, 0.05, 0.95]) == 3
    # where a row costs 20% of a pass it is not worth verifying at all
    assert _length(_stop(slope=0.2, step=0.1), [0.95, 0.95, 0.05, 0.95]) == 2
    # p_min 0.75 would stop at the 0.6 token; with cheap rows it is still worth verifying
    assert _length(_stop(slope=0.02, step=0.1), [0.95, 0.6, 0.95, 0.95]) == 4


def test_n_min_drafts_at_least_that_many():
    stop = GainStop(
        AcceptanceByConfidence(),
        verify_seconds=lambda w: 1.0 + 0.4 * (w - 1),
        first_seconds=0.5,
        step_seconds=0.5,
        n_min=3,
    )
    assert _length(stop, [0.05] * 6) >= 3


def test_the_controller_gives_a_rule_only_to_a_model_drafter_with_measured_costs():
    ctl = AdaptiveLength(8, gain_stop=True)
    assert ctl.stop_rule() is None  # nothing measured yet: p_min decides
    ctl.update(2, 2, 2, draft_evals=2, draft_seconds=0.2, first_seconds=0.1, fed=1, verify_seconds=1.1)
    ctl.update(0, 0, 0, draft_evals=0, draft_seconds=0.0, first_seconds=0.0, fed=0, verify_seconds=1.0)
    assert isinstance(ctl.stop_rule(), GainStop)
    assert AdaptiveLength(8, gain_stop=False).stop_rule() is None
    ctl.update(
        4,
        3,
        2,
        draft_evals=3,
        draft_seconds=0.3,
        first_seconds=0.1,
        fed=1,
        verify_seconds=1.1,
        confidence=[0.99, 0.99, 0.7],
    )
    assert ctl.calibration.seen[ctl.calibration.bucket(0.7)] == PRIOR_WEIGHT + 1
    assert ctl.predicted_speedup() is not None and ctl.predicted_speedup() > 1.0


def test_past_the_widest_measured_pass_the_curve_follows_its_measured_slope():
    ctl = AdaptiveLength(8)
    ctl.verify = {1: 1.0, 3: 1.1}
    assert ctl.verify_seconds(5) == pytest.approx(1.2)
    ctl.verify = {1: 1.0}
    assert ctl.verify_seconds(3) == pytest.approx(1.5)  # one width known: a quarter of a pass a row


def test_a_lookup_draft_gives_way_to_the_model_when_it_promises_fewer_accepted_tokens():
    import numpy as np

    from localspec.decoding.drafters import CombinedDrafter, Draft
    from localspec.decoding.stopping import expected_accepted
    from localspec.llama.sampling import SamplingParams

    assert expected_accepted([1.0, 0.5, 0.5]) == pytest.approx(1.75)

    class Fixed:
        name, free = "fixed", True

        def __init__(self, tokens, confidence):
            self.d = Draft(tokens=tokens, confidence=confidence, source=self.name)

        def draft(self, context, n, params, rng, stop=None):
            return self.d

    lookup = Fixed([1, 2], [0.6, 0.5])  # promises 0.9 accepted tokens
    model = Fixed([7, 8, 9, 10], [0.99] * 4)
    combined = CombinedDrafter(model, lookup)  # type: ignore[arg-type]
    args = ([0], 8, SamplingParams(), np.random.default_rng(0))
    assert combined.draft(*args).tokens == [1, 2]  # no rule (p_min): any match of 2 wins, as before
    rule = _stop(slope=0.02, step=0.1)
    rule.model_tokens = 3.2  # model rounds get 3.2 drafts accepted here
    assert combined.draft(*args, stop=rule).tokens == [7, 8, 9, 10]
    rule.model_tokens = 0.5
    assert combined.draft(*args, stop=rule).tokens == [1, 2]
