"""localspec.decoding.costs: measuring the verify curve on a busy machine, and the kept curves on the
command line.

The timings come from a fake clock that a fake model advances by what each pass "costs", so what a load
does to a measurement is exact and nothing here depends on this machine's speed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from localspec.cli import main
from localspec.decoding import costs as costsmod
from localspec.decoding.costs import MachineCosts, is_steady, measure, unsteady_widths, write_costs


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Model:
    """What :func:`measure` uses of :class:`localspec.llama.runtime.Model`; a pass of ``w`` tokens advances
    the
    clock by ``cost(w, i)``, ``i`` counting the timed passes after the warm-up one (0, 1, ...)."""

    n_ctx = 4096
    max_draft = 64
    memory_kind = "attention"  # a transformer: nothing to copy out before a pass

    def __init__(self, clock: _Clock, cost: Callable[[int, int], float], name: str = "fake.gguf") -> None:
        self.clock, self.cost, self.path = clock, cost, Path(name)
        self.tokens: list[int] = []
        self.passes = -1  # the first pass is the uncounted warm-up

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        return list(range(1, 60))

    def reset(self) -> None:
        self.tokens = []

    def sync(self, context: list[int]) -> list[int]:
        n = 0
        while n < min(len(self.tokens), len(context)) and self.tokens[n] == context[n]:
            n += 1
        self.tokens = self.tokens[:n]
        return context[n:]

    def decode(self, tokens: list[int]) -> None:
        self.tokens += tokens

    def decode_logits(self, tokens: list[int], *, outputs: int = 1) -> np.ndarray:
        if self.passes >= 0:
            self.clock.now += self.cost(len(tokens), self.passes)
        self.passes += 1
        self.tokens += tokens
        return np.zeros((outputs, 8), np.float32)

    def truncate(self, n: int) -> None:
        self.tokens = self.tokens[:n]

    def checkpoint(self, ahead: int) -> None:
        pass


def _curve(w: int) -> float:  # the machine's true cost of a w-token pass, in ms: dips at multiples of 4
    return 20.0 * (1.0 + 0.45 * (w - 1) - (1.5 if w % 4 == 0 else 0.0))


WIDTHS = tuple(range(1, 34))


def _measure(
    cost: Callable[[int, int], float], draft: Callable[[int, int], float] | None = None, **kw
) -> MachineCosts:
    clock = _Clock()
    drafter = _Model(clock, draft, name="draft.gguf") if draft is not None else None
    return measure(_Model(clock, cost), drafter, widths=WIDTHS, timer=clock, clock=lambda: "now", **kw)  # type: ignore[arg-type]


DRAFT_MS = 10.0  # the draft model's true cost of a one-token pass: half the target's


# The draft model's passes in sweep s (0-based) are numbered 4s - 1 to 4s + 2: at each of the two points of
# a sweep an uncounted one, then a timed one (4s and 4s + 2; pass -1 is the fake's warm-up, free).


def test_a_quiet_machine_is_measured_in_three_sweeps_exactly():
    costs = _measure(lambda w, i: _curve(w))
    assert costs.details["sweeps"] == 3 and costs.steady and costs.details["unsteady_widths"] == []
    assert costs.target_token_seconds == pytest.approx(20.0)
    for w in WIDTHS:
        assert costs.V(w) == pytest.approx(_curve(w) / _curve(1)), w


def test_a_load_over_two_of_three_sweeps_is_measured_through():
    """Another process slows every pass of the first two sweeps by 30%: the median of three timings would
    keep the load; the fastest timing does not, and a fourth sweep confirms the third."""
    n = len(WIDTHS)
    costs = _measure(lambda w, i: _curve(w) * (1.3 if i < 2 * n else 1.0))
    assert costs.details["sweeps"] == 4 and costs.steady
    assert costs.target_token_seconds == pytest.approx(20.0)
    assert all(costs.V(w) == pytest.approx(_curve(w) / _curve(1)) for w in WIDTHS)


def test_a_load_on_narrow_passes_only_does_not_bend_the_curve():
    """A load that slows one-token passes in two of the first three sweeps (what made a kept curve 14% low at
    b = 2 here) would divide the whole curve by it; the sweeps go on until width 1 agrees with itself."""
    n = len(WIDTHS)
    costs = _measure(lambda w, i: _curve(w) * (1.15 if w <= 2 and i < 2 * n else 1.0))
    assert costs.steady and costs.details["sweeps"] == 4
    assert costs.V(2) == pytest.approx(_curve(2) / _curve(1))


def test_a_machine_that_never_settles_is_marked_unsteady_after_the_last_sweep():
    rng = np.random.default_rng(0)
    costs = _measure(lambda w, i: _curve(w) * float(rng.uniform(1.0, 1.5)))
    assert costs.details["sweeps"] == costsmod.MAX_SWEEPS and not costs.steady
    assert costs.details["unsteady_widths"]
    assert MachineCosts.from_json(json.loads(json.dumps(costs.as_json()))).steady is False  # kept as such


def test_the_draft_model_is_timed_in_every_sweep_and_costs_its_second_fastest_timing():
    costs = _measure(lambda w, i: _curve(w), lambda w, i: DRAFT_MS)
    assert costs.details["sweeps"] == 3 and costs.steady and costs.details["draft_steady"] is True
    assert costs.draft_ratio == pytest.approx(0.5)
    assert costs.V(16) == pytest.approx(_curve(16) / _curve(1))  # the draft's passes do not bend the curve


def test_a_busy_spell_over_the_draft_timings_only_is_measured_through():
    """What a kept curve of a 0.5B draft and a 1.5B target held after a busy spell: "a draft-model token
    4.81 of it" and steady (the draft was timed after the sweeps, in back-to-back passes nothing checked).
    Here the draft's first five timings (two and a half sweeps) cost 10x: with one fast timing the two
    fastest disagree, a fourth sweep gives a second, and the ratio is the quiet machine's."""
    costs = _measure(lambda w, i: _curve(w), lambda w, i: DRAFT_MS * (10.0 if i < 9 else 1.0))
    assert costs.details["sweeps"] == 4 and costs.steady and costs.details["draft_steady"] is True
    assert costs.draft_ratio == pytest.approx(0.5)
    assert costs.details["unsteady_widths"] == []


def test_a_draft_model_that_never_settles_marks_the_measurement_busy(tmp_path, monkeypatch):
    """Every timing of the draft 19% under the one before (a load easing off all the way): the verify curve
    agrees in three sweeps, the draft never does; the sweeps go to the last, the result is unsteady, the
    first run says so naming the draft model, and ``cache info`` shows it as measured on a busy machine."""
    costs = _measure(lambda w, i: _curve(w), lambda w, i: DRAFT_MS * 3.0 * 0.9**i)
    assert costs.details["sweeps"] == costsmod.MAX_SWEEPS and not costs.steady
    assert costs.details["draft_steady"] is False and costs.details["unsteady_widths"] == []
    assert costs.unsteady_timings == "the draft model's token"
    assert MachineCosts.from_json(json.loads(json.dumps(costs.as_json()))).steady is False  # kept as such

    clock = _Clock()
    target = _Model(clock, lambda w, i: _curve(w), name="target.gguf")
    draft = _Model(clock, lambda w, i: DRAFT_MS * 3.0 * 0.9**i, name="draft.gguf")
    kept, said = _kept(monkeypatch, tmp_path, clock, target, draft, "k-draft-busy")
    assert not kept.steady and len(said) == 2
    assert "busy" in said[1] and "the draft model's token still differed by more than 5%" in said[1]
    assert "`auto` may choose the draft model wrongly" in said[1] and "next process measures" in said[1]
    out = _invoke("cache", "info").output
    assert "measured while the machine was busy (the timings of the draft model's token disagreed)" in out


def test_curves_kept_by_the_previous_version_are_kept_unless_they_hold_a_draft_cost(tmp_path, monkeypatch):
    """Version 3 timed the draft model unchecked (the 4.81 above), so its curves with a draft are measured
    again; its verify curves were measured as now and are kept."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    for key, draft in (("k-alone", None), ("k-pair", 0.322)):
        old = MachineCosts(0.067, {1: 1.0, 2: 1.9}, draft, key=key, measured="2026-12-01T03:00:00")
        old.details = {"steady": True}
        write_costs(old)
        path = costsmod.costs_path(key)
        path.write_text(path.read_text().replace('"version": 4', '"version": 3'))
    assert costsmod.read_costs("k-alone") is not None and costsmod.read_costs("k-pair") is None
    out = _invoke("cache", "info").output
    assert "draft-model cost was measured by an older localspec without a check for load" in out
    assert "measured again the next time it is needed" in out and "4.81" not in out


def _kept(monkeypatch, tmp_path, clock, target, draft, key: str) -> tuple[MachineCosts, list[str]]:
    """``machine_costs`` on fake models under ``clock`` (kept under ``key`` in a fresh home), and what it
    said."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    real = costsmod.measure
    monkeypatch.setattr(costsmod, "measure", lambda t, d: real(t, d, widths=WIDTHS, timer=clock))
    monkeypatch.setattr(costsmod, "_key_of", lambda *a, **k: key)
    said: list[str] = []
    return costsmod.machine_costs(target, draft, threads=2, notify=said.append), said  # type: ignore[arg-type]


def test_steadiness_is_width_one_and_nearly_every_width_agreeing():
    quiet = {w: [1.0 * w, 1.01 * w, 1.5 * w] for w in range(1, 21)}
    assert unsteady_widths(quiet) == [] and is_steady(quiet)
    assert not is_steady(quiet | {1: [1.0, 1.2]})  # every V(b) is a ratio to width 1
    assert is_steady(quiet | {7: [7.0, 8.0]})  # one width in twenty
    assert not is_steady(quiet | {7: [7.0, 8.0], 9: [9.0, 10.0], 11: [11.0, 12.0]})
    assert not is_steady({1: [1.0]}) and not is_steady({})  # one timing agrees with nothing


def test_an_unsteady_measurement_is_said_with_the_next_step(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    clock = _Clock()
    target = _Model(clock, lambda w, i: _curve(w) * float(rng.uniform(1.0, 1.5)), name="target.gguf")
    costs, said = _kept(monkeypatch, tmp_path, clock, target, None, "k-busy")
    assert not costs.steady and len(said) == 2
    assert "busy" in said[1] and "the next process measures them again" in said[1]
    assert costs.details["target"] == "target.gguf" and costs.details["threads"] == 2
    assert costsmod.read_costs("k-busy") is not None  # kept for this process and as a fallback
    assert costsmod.stored_costs(target, None, threads=2) is None  # type: ignore[arg-type]  # (pending)
    # the next processes measure it again, up to UNSTEADY_TRIES in all; then it is kept for good
    for tries in range(2, costsmod.UNSTEADY_TRIES + 1):
        said.clear()
        costs = costsmod.machine_costs(target, None, threads=2, notify=said.append)  # type: ignore[arg-type]
        assert costs.details["tries"] == tries and said and "measuring" in said[0]
    assert "localspec cache clear --costs" in said[1]  # the last try names the way out
    said.clear()
    kept = costsmod.machine_costs(target, None, threads=2, notify=said.append)  # type: ignore[arg-type]
    assert said == [] and kept.details["tries"] == costsmod.UNSTEADY_TRIES
    assert costsmod.stored_costs(target, None, threads=2) is not None  # type: ignore[arg-type]


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args), prog_name="localspec")


def test_cache_info_lists_the_kept_curves_and_clear_costs_has_them_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    quiet = MachineCosts(
        0.0219, {1: 1.0, 2: 2.04, 16: 6.55, 32: 11.81}, 0.0139, key="k-quiet", measured="2026-12-01T03:00:00"
    )
    quiet.details = {"target": "qwen-1.5b.gguf", "draft": "qwen-0.5b.gguf", "threads": 2, "steady": True}
    busy = MachineCosts(
        0.0246, {1: 1.0, 2: 1.7, 16: 8.98, 32: 16.7}, key="k-busy", measured="2026-12-01T02:00:00"
    )
    busy.details = {"steady": False}  # an old file says nothing of its models
    for c in (quiet, busy):
        write_costs(c)
    (costsmod.costs_dir() / "broken.json").write_text("{not json")
    out = _invoke("cache", "info").output
    assert "No suffix cache" in out and "Measured decoding costs" in out
    assert "qwen-1.5b.gguf + qwen-0.5b.gguf, 2 threads, measured 2026-12-01 03:00:00" in out
    assert "21.9 ms per target token, a draft-model token 0.63 of it" in out
    assert "2 / 16 / 32 tokens costs 2.04 / 6.55 / 11.81 single passes" in out
    assert out.count("measured while the machine was busy") == 1 and "models not recorded" in out
    assert "broken.json" in out and "unusable" in out and "Traceback" not in out
    assert out.index("k-quiet") < out.index("k-busy")  # newest first
    res = _invoke("cache", "clear", "--costs")
    assert res.exit_code == 0 and "Deleted 3 measured curve(s)" in res.output
    assert not list(costsmod.costs_dir().glob("*")) and costsmod.list_costs() == []
    assert "Measured decoding costs" not in _invoke("cache", "info").output


def test_clear_costs_leaves_the_suffix_store_and_clear_leaves_the_costs(tmp_path, monkeypatch):
    from localspec.suffix.index import SuffixIndex
    from localspec.suffix.store import SuffixStore
    from localspec.suffix.store_info import list_stores

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    store = SuffixStore(None, "f" * 64, n_vocab=1000)
    index = SuffixIndex()
    index.add_request(list(range(100)))
    assert store.save(index)
    write_costs(MachineCosts(0.02, {1: 1.0, 2: 2.0}, key="k1", measured="x"))
    assert "Deleted 1 measured curve(s)" in _invoke("cache", "clear", "--costs").output
    assert len(list_stores()) == 1
    write_costs(MachineCosts(0.02, {1: 1.0, 2: 2.0}, key="k1", measured="x"))
    assert "Deleted 1 file(s)" in _invoke("cache", "clear", "--yes").output
    assert list_stores() == [] and costsmod.read_costs("k1") is not None
