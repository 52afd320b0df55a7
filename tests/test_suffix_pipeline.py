"""The suffix cache through the public API: strategies, the store on disk, the corpus, the "auto" router."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _lossless import assert_lossless, traced

import localspec
from localspec.decoding.costs import MachineCosts
from localspec.settings import LOOKUP_N_MAX, STRATEGIES
from localspec.suffix.store_info import list_stores

CODE = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\ndef fact(n):"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _argmax_law(pipe, prompt, **kw):
    """Every emitted token is the argmax of the row that verified it (greedy losslessness)."""
    pipe.trace = []
    try:
        result = pipe.generate(prompt, **kw)
        trace = pipe.trace
    finally:
        pipe.trace = None
    assert [t[0] for t in trace] == result.tokens
    assert all(tok == argmax for tok, _, argmax, _ in trace)
    return result


def test_suffix_strategies_are_declared_once():
    for s in ("suffix", "model+suffix", "auto"):
        assert s in STRATEGIES


def test_a_strategy_name_is_parsed_in_one_place():
    from localspec.errors import SettingsError
    from localspec.settings import MODEL_STRATEGIES, SUFFIX_STRATEGIES, parse_strategy

    assert SUFFIX_STRATEGIES[-1] == "auto" and {"suffix", "model+suffix"} <= set(SUFFIX_STRATEGIES)
    assert {"model", "model+ngram", "model+suffix"} <= set(MODEL_STRATEGIES)
    assert all(parse_strategy(n).model for n in MODEL_STRATEGIES)
    assert all(parse_strategy(n).lookup == "suffix" for n in SUFFIX_STRATEGIES)
    both = parse_strategy("model+ngram")
    assert both.model and both.lookup == "ngram" and both.combined and both.drafts
    auto = parse_strategy("auto")
    assert auto.routed and auto.may_use_model and not auto.model and auto.lookup == "suffix"
    assert not parse_strategy("none").drafts and not parse_strategy("suffix").combined
    with pytest.raises(SettingsError, match="is not one of"):
        parse_strategy("model+model")


def test_the_second_request_drafts_from_the_first_and_stays_lossless(home):
    with localspec.load(n_threads=2, n_ctx=1024, strategy="suffix") as pipe:
        assert pipe.settings.n_max == LOOKUP_N_MAX  # the cache sizes its own drafts
        first, first_trace = traced(pipe, CODE, max_tokens=48)
        second, second_trace = traced(pipe, CODE, max_tokens=48)
    # the same text, but for a near-tie that another batching of the same tokens flips (seen with the
    # tiny pair on an AVX-512 build: the second request verifies in wider passes than the first)
    assert_lossless(first, first_trace, second, second_trace)
    assert_lossless(second, second_trace, first, first_trace)
    by_source = second.stats.accepted_by_source
    assert by_source.get("history", 0) >= 20, second.stats.as_dict()
    assert {s for s in second.sources if s} <= {"prompt", "history"}
    assert "history" in second.stats.summary_line()


def test_the_store_outlives_the_process_and_can_be_switched_off(home):
    with localspec.load(n_threads=2, n_ctx=1024, strategy="suffix") as pipe:
        pipe.generate(CODE, max_tokens=40)
        learnt = pipe.suffix_drafter().carried_calibration()
    files = list((home / "suffix").glob("*"))
    assert sorted(f.suffix for f in files) == [".lscal", ".lsstore"]  # the requests, and how drafts ran
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    with localspec.load(n_threads=2, n_ctx=1024, strategy="suffix") as pipe:  # a new pipeline: read from disk
        assert learnt and sorted(pipe.suffix_drafter().carried_calibration()) == sorted(learnt)
        again = pipe.generate(CODE, max_tokens=40)
    assert again.stats.accepted_by_source.get("history", 0) >= 20

    off = home.parent / "off"
    os.environ["LOCALSPEC_HOME"] = str(off)
    with localspec.load(n_threads=2, n_ctx=1024, strategy="suffix", suffix_store=False) as pipe:
        pipe.generate(CODE, max_tokens=40)
        remembered = pipe.generate(CODE, max_tokens=40)  # memory within the pipeline still works
    assert remembered.stats.accepted_by_source.get("history", 0) >= 20
    assert not (off / "suffix").exists()


def test_store_problem_says_when_saves_fail_and_a_bad_namespace_is_refused_at_load(tmp_path, monkeypatch):
    """store_problem was copied once from the load: a store whose every save failed read as fine."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LOCALSPEC_HOME", str(blocker / "cache"))  # cannot be made: a file is in the way
    with localspec.load(n_threads=2, n_ctx=1024, strategy="suffix") as pipe:
        assert pipe.store_problem is None  # nothing ran yet
        text = pipe.generate(CODE, max_tokens=8)
        assert "cannot save" in (pipe.store_problem or ""), pipe.store_problem
        assert len(text.tokens) == 8  # the generation itself is unaffected
    with pytest.raises(localspec.errors.CacheError, match="namespace '../x' is not usable"):
        localspec.load(n_threads=2, n_ctx=1024, store_namespace="../x")


def test_a_corpus_drafts_with_its_own_source(home, tmp_path):
    corpus = tmp_path / "repo"
    corpus.mkdir()
    (corpus / "lib.py").write_text(CODE + "\n    return 1 if n < 2 else n * fact(n - 1)\n" * 3)
    with localspec.load(
        n_threads=2, n_ctx=1024, strategy="suffix", corpus=corpus, suffix_store=False
    ) as pipe:
        result = _argmax_law(pipe, CODE, max_tokens=32)
    assert result.stats.drafted_by_source.get("corpus", 0) > 0, result.stats.as_dict()
    # kept in the store, which names the folder (`localspec cache info` shows it, as after `index`)
    with localspec.load(n_threads=2, n_ctx=1024, strategy="suffix", corpus=corpus) as pipe:
        pipe.generate(CODE, max_tokens=8)
    (info,) = list_stores(home / "suffix")
    assert info.corpus_documents == 1 and info.corpus_root == str(corpus.resolve())


def test_a_running_pipeline_takes_in_an_index_run_and_forgets_on_clear(home, tmp_path):
    """The user's way: a server (here a pipeline) runs; ``localspec index DIR`` in another shell; the
    server's next request keeps that corpus and drafts from it. Then ``localspec cache clear``: the
    server forgets what it held at the end of its next request."""
    from click.testing import CliRunner

    from localspec.cli import main as cli

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "lib.py").write_text(CODE + "\n    return 1 if n < 2 else n * fact(n - 1)\n")
    runner = CliRunner()
    with localspec.load(n_threads=2, n_ctx=1024, strategy="suffix") as pipe:
        pipe.generate("import os", max_tokens=8)
        assert runner.invoke(cli, ["index", str(repo)]).exit_code == 0
        pipe.generate("import sys", max_tokens=8)  # its save takes in the corpus
        assert pipe.suffix_drafter().index.corpus_documents == 1
        result = _argmax_law(pipe, CODE, max_tokens=32)
        assert result.stats.drafted_by_source.get("corpus", 0) > 0, result.stats.as_dict()
        out = runner.invoke(cli, ["cache", "info"]).output
        assert "corpus" in out and "in 1 files" in out and "3 requests" in out, out
        assert runner.invoke(cli, ["cache", "clear", "--yes"]).exit_code == 0
        pipe.generate("import re", max_tokens=8)
        index = pipe.suffix_drafter().index
        assert index.history_requests == 0 and index.corpus_documents == 0
        assert pipe.suffix_drafter().calibration == {} and not list((home / "suffix").iterdir())


def test_auto_routes_from_measured_costs_and_says_why(home):
    with localspec.load(n_threads=2, n_ctx=1024, strategy="auto") as pipe:
        # costs measured once for this machine and kept under LOCALSPEC_HOME/costs
        costs = pipe.machine_costs()
        assert costs.V(1) == 1.0 and costs.draft_token_seconds is not None
        assert list((home / "costs").glob("*.json"))
        pipe._costs = expensive = MachineCosts(1.0, {1: 1.0, 2: 1.5, 8: 4.0, 32: 14.0}, 0.6)
        result = _argmax_law(pipe, CODE, max_tokens=24)
        assert result.stats.strategy.name == "suffix"
        route = result.stats.route
        assert route is not None and route.strategy.name == "suffix" and "would not pay" in route.reason
        pipe._costs = MachineCosts(1.0, {1: 1.0, 2: 1.05, 8: 1.3, 32: 2.0}, 0.05)  # a GPU-like curve
        result = _argmax_law(pipe, CODE, max_tokens=24)
        assert result.stats.strategy.name == "model+suffix" and pipe.route is not None
        assert expensive.draft_ratio == 0.6


def test_verify_curve_interpolates_and_survives_a_bad_file(home):
    from localspec.decoding.costs import read_costs, write_costs

    c = MachineCosts(0.1, {1: 1.0, 4: 2.5, 12: 5.0, 16: 5.0}, key="k1")
    assert c.V(1) == 1.0 and c.V(4) == 2.5 and c.V(8) == pytest.approx(3.75) and c.V(14) == 5.0
    # past the widest width: the slope over the upper half of the measured widths (4 -> 16 here), not
    # the last segment's, which on a real CPU may end in a dip (V(16) < V(15)) or start from one
    assert c.V(32) == pytest.approx(5.0 + 16 * 2.5 / 12)
    dip = MachineCosts(0.1, {1: 1.0, 8: 4.5, 15: 8.0, 16: 7.0, 17: 9.0})
    assert dip.V(16) == 7.0 and dip.V(33) == pytest.approx(9.0 + 16 * 0.5)
    assert c.ceiling(15) == pytest.approx(16 / 5.0)
    path = write_costs(c)
    assert read_costs("k1").verify == c.verify
    Path(path).write_text("{not json")
    assert read_costs("k1") is None  # measured again, never a crash
    for field, bad in (("verify", {"1": 1.0, "2": "Infinity"}), ("verify", {"1": 1.0, "2": -2.0})) + tuple(
        ("target_token_seconds", x) for x in (0, -1.0, float("nan"), float("inf"))
    ):
        stored = c.as_json() | {field: bad}
        Path(path).write_text(json.dumps(stored).replace('"Infinity"', "Infinity"))
        assert read_costs("k1") is None, (field, bad)  # a curve that would silently stop every draft


def test_costs_pending_says_when_the_next_generation_will_measure_first(home, monkeypatch):
    monkeypatch.setattr("localspec.decoding.costs.UNSTEADY_TRIES", 1)  # kept even if this machine is busy now
    with localspec.load(n_threads=2, n_ctx=1024, strategy="suffix", suffix_store=False) as pipe:
        assert not pipe.costs_pending("none") and not pipe.costs_pending("model")  # they never need them
        assert pipe.costs_pending() and pipe.costs_pending("auto")
        pipe.machine_costs()
        assert not pipe.costs_pending()
    with localspec.load(n_threads=2, n_ctx=1024, strategy="suffix", suffix_store=False) as again:
        assert not again.costs_pending()  # stored under LOCALSPEC_HOME/costs: a new process reads them


def test_each_drafter_counts_its_calls_tokens_and_seconds_and_auto_learns_from_them(home):
    """A combination's parts are counted apart (lookups and the draft model), as llama.cpp's
    per-implementation counters do; the router records what the draft model drafted, on how many rounds,
    for later requests."""
    with localspec.load(n_threads=2, n_ctx=1024, strategy="auto", suffix_store=False) as pipe:
        pipe._costs = MachineCosts(1.0, {1: 1.0, 2: 1.05, 8: 1.3, 32: 2.0}, 0.05)  # the model pays here
        stats = _argmax_law(pipe, CODE, max_tokens=24).stats
        assert stats.strategy.name == "model+suffix"
        parts = stats.by_drafter
        assert (
            set(parts) <= {"model", "suffix"} and "suffix" in parts
        )  # lookups are asked every drafting round
        assert sum(p.drafted for p in parts.values()) == stats.drafted
        assert sum(p.accepted for p in parts.values()) == stats.accepted
        assert all(p.rounds <= p.calls and p.accepted <= p.drafted for p in parts.values())
        assert sum(p.seconds for p in parts.values()) <= stats.draft_seconds + 1e-6
        model = parts.get("model")
        record = pipe.router.model
        assert record is not None
        drafted = stats.drafted_by_source.get("model", 0)
        assert (model.drafted if model else 0) == drafted
        measured = drafted > 0 and stats.predicted_speedup is not None  # else it teaches no speed
        assert record.tokens == (drafted if measured else 0)
        assert record.rounds == (model.rounds if measured and model else 0)
        assert record.requests == (1 if measured else 0)  # a request that drafted nothing teaches nothing
        again = _argmax_law(pipe, CODE, max_tokens=8).stats
        assert again.route is not None
        if record.estimate() is not None:
            assert f"measured on {drafted} drafted tokens" in again.route.reason


def test_a_model_alone_is_one_drafter_counted_per_round(home):
    with localspec.load(n_threads=2, n_ctx=1024, strategy="model", suffix_store=False) as pipe:
        stats = _argmax_law(pipe, CODE, max_tokens=16).stats
    assert set(stats.by_drafter) == {"model"}
    model = stats.by_drafter["model"]
    assert model.drafted == stats.drafted and model.accepted == stats.accepted
    assert 0 < model.rounds <= model.calls and model.seconds == pytest.approx(stats.draft_seconds, abs=1e-3)


def test_auto_keeps_the_draft_model_after_a_tiny_first_request_where_the_costs_say_it_pays(home):
    """A 4-token first request (a warm-up) drafts a token or two and its controller's figure from one round
    is noise (0.15x was seen): it must not shut the draft model out of the requests after it."""
    with localspec.load(n_threads=2, n_ctx=1024, strategy="auto", suffix_store=False) as pipe:
        pipe._costs = MachineCosts(1.0, {1: 1.0, 2: 1.05, 8: 1.3, 32: 2.0}, 0.05)  # a big target's curve
        first = _argmax_law(pipe, CODE, max_tokens=4).stats
        assert first.strategy.name == "model+suffix" and first.drafted_by_source.get("model", 0) <= 4
        for _ in range(2):
            later = _argmax_law(pipe, CODE, max_tokens=8).stats
            assert later.strategy.name == "model+suffix", later.route
