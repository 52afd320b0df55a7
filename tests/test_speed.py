"""The one model of speed (localspec.decoding.speed) on numbers worked out by hand."""

from __future__ import annotations

import pytest

from localspec.decoding import speed
from localspec.decoding.costs import MachineCosts, linear_costs
from localspec.decoding.routing import model_speed


def test_expected_tokens_from_reach_per_position_and_iid():
    assert speed.expected_tokens([0.8, 0.5, 0.25], 2) == pytest.approx(2.3)
    assert speed.expected_tokens([0.8, 0.5, 0.25], 5) == pytest.approx(2.55)  # past the measured: 0
    assert speed.expected_tokens([0.8], 0) == 1.0
    assert speed.iid_reach(0.5, 3) == [0.5, 0.25, 0.125]
    # Leviathan et al. eq. 1: (1 - a^(k+1)) / (1 - a)
    assert speed.expected_tokens(speed.iid_reach(0.8, 4), 4) == pytest.approx(3.3616)
    assert speed.expected_tokens(speed.iid_reach(1.0, 3), 3) == 4.0
    assert speed.expected_tokens(speed.iid_reach(0.0, 6), 6) == 1.0
    assert speed.expected_tokens_by_length([0.8, 0.5], 3) == pytest.approx([1.0, 1.8, 2.3, 2.3])


def test_fit_acceptance_inverts_the_iid_model():
    for a in (0.1, 0.5, 0.8, 0.97):
        for k in (1, 3, 6):
            m = speed.expected_tokens(speed.iid_reach(a, k), k) - 1.0
            assert speed.fit_acceptance(m, k) == pytest.approx(a, abs=1e-6)
    assert speed.fit_acceptance(0.0, 4) == 0.0
    assert speed.fit_acceptance(4.0, 4) == 1.0


def test_the_verify_line_runs_through_passes_of_two_rows_and_more_not_through_one():
    # V(2) = 1.6, then 0.3 a row: a line through V(1) = 1 would have read 1.3 at two rows
    pts = [(2.0, 1.6, 1.0), (4.0, 2.2, 1.0), (6.0, 2.8, 2.0), (1.0, 1.0, 50.0)]
    line = speed.VerifyLine.fit(pts)
    assert line is not None
    assert line.v2 == pytest.approx(1.6) and line.slope == pytest.approx(0.3)
    assert line(1) == 1.0 and line(2) == pytest.approx(1.6) and line(5) == pytest.approx(2.5)
    assert speed.VerifyLine.fit([(1.0, 1.0, 1.0)]) is None
    assert speed.VerifyLine.fit([(2.0, 0.8, 1.0), (4.0, 0.5, 1.0)]) == speed.VerifyLine(v2=1.0, slope=0.0)


def test_round_cost_speedup_and_the_ceiling_at_the_best_length():
    line = speed.VerifyLine(v2=1.6, slope=0.3)
    reach = [0.8, 0.6, 0.4, 0.2]
    # k = 2: (1 + 0.8 + 0.6) / (2 x 0.1 + V(3) = 1.9) = 2.4 / 2.1
    assert speed.round_cost(2, draft=0.1, verify=line) == pytest.approx(2.1)
    assert speed.round_cost(0, draft=0.1, verify=line) == 1.0
    assert speed.speedup_at(reach, 2, draft=0.1, verify=line) == pytest.approx(2.4 / 2.1)
    by_k = {1: 1.8 / 1.7, 2: 2.4 / 2.1, 3: 2.8 / 2.5, 4: 3.0 / 2.9}
    k, best = speed.best_length(reach, 4, draft=0.1, verify=line)
    assert (k, best) == (2, pytest.approx(by_k[2]))
    # a rollback of 0.5 passes per drafting round: 2.4 / 2.6 < 1, so the target alone wins where allowed
    assert speed.best_length(reach, 4, draft=0.1, verify=line, rollback=0.5, k_min=0) == (0, 1.0)
    k, best = speed.best_length(reach, 4, draft=0.1, verify=line, rollback=lambda k: 0.1 * k)
    assert (k, best) == (2, pytest.approx(2.4 / 2.3))  # k=1: 1.8 / 1.8, k=3: 2.8 / 2.8
    assert speed.speedup(3.0, 1.5, alone=0.5) == pytest.approx(1.0)


def test_a_rollback_past_the_snapshots():
    line = speed.VerifyLine(v2=1.5, slope=0.5)  # V(b) = 0.5 + 0.5 b
    assert speed.rollback_passes(2, 0.5, save=0.1, restore=0.2, snapshots=2, verify=line) == 0.0
    # k = 2, a = 0.5: reject 0.75; kept = (0.5 x 1 + 0.25 x 2) / 0.75 = 4/3: a replay pass of its own,
    # V(round(1 + 4/3) = 2) - V(1) = 0.5 more than the one-row pass that token would have cost
    got = speed.rollback_passes(2, 0.5, save=0.1, restore=0.2, snapshots=0, verify=line)
    assert got == pytest.approx(0.1 + 0.75 * (0.2 + 0.5))
    assert speed.rollback_passes(3, 1.0, save=0.1, restore=0.2, snapshots=0, verify=line) == 0.1
    low, high = (
        speed.rollback_passes(4, a, save=0.1, restore=0.2, snapshots=0, verify=line) for a in (0.3, 0.9)
    )
    assert low > high > 0.1  # drafts rejected more often take more back
    costs = linear_costs(0.5)
    costs.details["rollback"] = {"snapshots": 0, "save": 0.1, "restore": 0.2}
    assert costs.rollback_passes(2, 0.5) == pytest.approx(got)


def test_auto_routes_by_the_same_model():
    costs = MachineCosts(target_token_seconds=1.0, verify={1: 1.0, 2: 1.2, 3: 1.4}, draft_token_seconds=0.1)
    # a = 0.5: k=1 1.5 / 1.3, k=2 1.75 / 1.6
    assert model_speed(costs, 0.5, 2) == (pytest.approx(1.5 / 1.3), 1)
    assert model_speed(costs, 0.0, 2) == (1.0, 0)
    assert linear_costs(0.5).ceiling(3) == pytest.approx(4 / 2.5)


def test_a_draft_that_stops_at_its_first_rejection_bounds_any_stopping_rule():
    line = speed.VerifyLine(v2=1.6, slope=0.3)
    reach = [0.8, 0.6, 0.4, 0.2]
    # k = 3: it drafts E(2) = 2.4 tokens on average, verifies 3.4 rows: 2.8 / (0.24 + 2.02)
    assert speed.stopped_round_cost(reach, 3, draft=0.1, verify=line) == pytest.approx(0.24 + 2.02)
    assert speed.stopped_round_cost(reach, 0, draft=0.1, verify=line) == 1.0
    k, best = speed.best_length(reach, 4, draft=0.1, verify=line, stops=True)
    by_k = {1: 1.8 / 1.7, 2: 2.4 / (0.18 + 1.84), 3: 2.8 / 2.26, 4: 3.0 / (0.28 + 2.14)}
    assert (k, best) == (4, pytest.approx(by_k[4]))
    assert best >= speed.best_length(reach, 4, draft=0.1, verify=line)[1]
