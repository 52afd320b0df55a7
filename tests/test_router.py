"""The ``auto`` router (localspec.decoding.routing): what it decides from the measured costs and from what
each model drafter measured, and that it keeps learning: a request that drafted nothing or a handful of
tokens, or a drafter measured as not paying, never locks a drafter out."""

from __future__ import annotations

import pytest

from localspec.decoding.costs import MachineCosts, linear_costs
from localspec.decoding.routing import FADE, MIN_GAIN, RETRY_FIRST, RETRY_MAX, Router
from localspec.settings import LOOKUPS_ONLY, MODEL_WITH_LOOKUPS, MTP_WITH_LOOKUPS


def _costs(slope: float, draft: float) -> MachineCosts:
    c = linear_costs(slope)
    c.draft_token_seconds = draft
    return c


CHEAP = _costs(0.05, 0.05)  # a big target (or a GPU): a draft token costs 0.05 of a target token
DEAR = _costs(0.42, 0.48)  # a small CPU: the draft model costs half a target token


def _route(router: Router, costs: MachineCosts | None = CHEAP, n_max: int = 8):
    return router.route(costs=lambda: costs, n_max=n_max)


def test_route_is_a_pure_decision_from_the_costs_before_anything_is_measured():
    assert _route(Router(model=False, mtp=False)).strategy == LOOKUPS_ONLY
    assert _route(Router(model=True, mtp=False), CHEAP).strategy == MODEL_WITH_LOOKUPS
    dear = _route(Router(model=True, mtp=False), DEAR)
    assert (
        dear.strategy == LOOKUPS_ONLY
        and "would not pay" in dear.reason
        and "prior acceptance 0.80" in dear.reason
    )
    first = _route(Router(model=True, mtp=False), None)
    assert first.strategy == MODEL_WITH_LOOKUPS and "costs not measured yet" in first.reason
    # a measured acceptance (a run without the adaptive controller: no speed) moves the prediction
    sure = Router(model=True, mtp=False)
    sure.model.record(1, drafted=1000, accepted=990, rounds=200, speed=None)
    r = _route(sure, DEAR)
    assert r.strategy == MODEL_WITH_LOOKUPS and "measured acceptance 0.99" in r.reason


def test_a_request_that_drafted_nothing_teaches_nothing():
    """The lock-out seen on the F16 target: a 4-token first request drafted 0 tokens and its controller's
    prediction (1.03x) became the verdict on the draft model for every later request."""
    router = Router(model=True, mtp=False)
    assert _route(router).strategy == MODEL_WITH_LOOKUPS
    router.model.record(router.requests, drafted=0, accepted=0, rounds=0, speed=1.03)
    assert router.model.estimate() is None
    again = _route(router)
    assert again.strategy == MODEL_WITH_LOOKUPS and "1.03" not in again.reason


def test_a_handful_of_tokens_measured_slow_does_not_outweigh_the_costs_prediction():
    router = Router(model=True, mtp=False)
    _route(router)
    router.model.record(router.requests, drafted=2, accepted=2, rounds=1, speed=0.15)  # a first request's
    est = router.model.estimate()
    assert est is not None and not est.pays and est.unsure  # one standard error reaches paying
    again = _route(router)
    assert (
        again.strategy == MODEL_WITH_LOOKUPS and "2 drafted tokens in 1 rounds over 1 request" in again.reason
    )


def test_a_handful_of_tokens_measured_slow_is_measured_again_at_the_next_request():
    router = Router(model=False, mtp=True)  # no prediction to weigh it against
    _route(router, None)
    router.mtp.record(router.requests, drafted=6, accepted=3, rounds=2, speed=0.6)
    est = router.mtp.estimate()
    assert est is not None and not est.pays and est.unsure
    retry = _route(router, None)
    assert retry.strategy == MTP_WITH_LOOKUPS and "tried again" in retry.reason
    assert "6 drafted tokens in 2 rounds over 1 request" in retry.reason  # says what it measured, on what
    router.mtp.record(router.requests, drafted=300, accepted=270, rounds=80, speed=1.6)
    est = router.mtp.estimate()
    assert est is not None and est.pays and est.speed > 1.5  # weighed by tokens: the 6 barely count
    after = _route(router, None)
    assert after.strategy == MTP_WITH_LOOKUPS and after.reason.endswith("over 2 requests: it pays")


def test_a_handful_of_tokens_measured_slow_waits_where_the_costs_say_it_does_not_pay_either():
    """On a small CPU (a draft token costs half a target token) a retry whose adaptive controller drafted a
    few tokens measured too little to be sure: with the costs' prediction saying no as well, the draft
    model is not run again at every next request (each one paid the draft model's prompt), but after the
    waits of a drafter that does not pay; it still gets them."""
    router = Router(model=True, mtp=False)
    runs = []
    for _ in range(60):
        if _route(router, DEAR).strategy == MODEL_WITH_LOOKUPS:
            runs.append(router.requests)
            router.model.record(router.requests, drafted=2, accepted=1, rounds=1, speed=0.3)
    assert runs[0] == RETRY_FIRST and len(runs) >= 3
    assert all(b - a >= RETRY_FIRST for a, b in zip(runs, runs[1:], strict=False))


def test_a_drafter_surely_not_paying_is_tried_again_after_waits_that_double():
    router = Router(model=True, mtp=False)
    runs = []
    for _ in range(200):
        r = _route(router, DEAR)
        if r.strategy == MODEL_WITH_LOOKUPS:
            runs.append(router.requests)
            router.model.record(router.requests, drafted=400, accepted=200, rounds=100, speed=0.8)
        else:
            assert r.strategy == LOOKUPS_ONLY
    gaps = [b - a for a, b in zip(runs, runs[1:], strict=False)]
    assert runs[0] == RETRY_FIRST  # predicted not to pay, never run: tried once after RETRY_FIRST requests
    assert gaps[0] == 2 * RETRY_FIRST and gaps == sorted(gaps) and max(gaps) == RETRY_MAX  # never locked out


def test_a_prediction_that_disagrees_with_the_measurement_brings_the_retry_forward():
    router = Router(model=True, mtp=False)
    _route(router, CHEAP)
    for _ in range(3):  # surely slow, several times: the wait would grow
        router.model.record(router.requests, drafted=400, accepted=380, rounds=100, speed=0.8)
    assert router.model.wait > RETRY_FIRST
    routes = [_route(router, CHEAP) for _ in range(RETRY_FIRST)]
    assert [r.strategy for r in routes[:-1]] == [LOOKUPS_ONLY] * (RETRY_FIRST - 1)
    assert "with the costs' prediction" in routes[0].reason
    assert routes[-1].strategy == MODEL_WITH_LOOKUPS and "tried again" in routes[-1].reason


def test_older_requests_fade_so_a_drafter_that_stopped_paying_is_dropped():
    router = Router(model=True, mtp=False)
    record = router.model
    assert record is not None
    for i in range(5):
        record.record(i + 1, drafted=100, accepted=90, rounds=25, speed=1.5)
    for i in range(5, 12):
        record.record(i + 1, drafted=100, accepted=40, rounds=25, speed=0.7)
    est = record.estimate()
    assert est is not None and est.speed < 0.8 + 0.1 and not est.unsure
    assert est.speed == pytest.approx((1.5 * FADE**7 * (1 - FADE**5) + 0.7 * (1 - FADE**7)) / (1 - FADE**12))


def test_the_mtp_layers_run_until_measured_then_as_measured():
    router = Router(model=False, mtp=True)
    first = _route(router, None)
    assert first.strategy == MTP_WITH_LOOKUPS and "not measured yet" in first.reason
    router.mtp.record(router.requests, drafted=200, accepted=180, rounds=50, speed=MIN_GAIN + 0.2)
    assert _route(router, None).strategy == MTP_WITH_LOOKUPS
    slow = Router(model=False, mtp=True)
    _route(slow, None)
    slow.mtp.record(slow.requests, drafted=400, accepted=100, rounds=100, speed=MIN_GAIN - 0.2)
    low = _route(slow, None)
    assert low.strategy == LOOKUPS_ONLY and "lookups only" in low.reason and "the MTP layers" in low.reason


def test_with_both_loaded_each_is_measured_then_the_faster_runs():
    router = Router(model=True, mtp=True)
    first = _route(router, None)  # nothing known of either: the draft model first
    assert first.strategy == MODEL_WITH_LOOKUPS and "the MTP layers not measured yet" in first.reason
    router.model.record(router.requests, drafted=300, accepted=240, rounds=80, speed=1.2)
    second = _route(router, None)
    assert second.strategy == MTP_WITH_LOOKUPS and "the draft model at 1.20x" in second.reason
    router.mtp.record(router.requests, drafted=300, accepted=270, rounds=80, speed=1.4)
    assert _route(router, None).strategy == MTP_WITH_LOOKUPS
    router.model.record(router.requests, drafted=3000, accepted=2900, rounds=600, speed=1.9)
    third = _route(router, None)
    assert third.strategy == MODEL_WITH_LOOKUPS and "the MTP layers at 1.40x" in third.reason


def test_auto_says_when_it_decided_by_costs_measured_on_a_busy_machine():
    busy = _costs(0.05, 0.05)
    busy.details["steady"] = False
    r = _route(Router(model=True, mtp=False), busy, n_max=4)
    assert "measured on a busy machine" in r.reason and "cache clear --costs" in r.reason
