"""The benchmark: prompt files, arithmetic (ceiling, medians, interleaving), report files, tuner, CLI.

The end-to-end runs use the embedded tiny pair through real llama.cpp; the llama.cpp peer is only exercised
when its server has been built (never in CI).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from localspec.bench import arithmetic as benchmath
from localspec.bench import report, tune, workloads
from localspec.bench import single as bench
from localspec.bench.tuning import Tuning
from localspec.bench.workloads import Prompt, RunRecord, Workload
from localspec.decoding import speed
from localspec.errors import BenchError
from localspec.settings import (
    BASELINE,
    MAX_TUNE_SWEEP,
    PAIR_STRATEGIES,
    SPECULATIVE_STRATEGIES,
    DraftSettings,
    max_threads,
)

# ---------------------------------------------------------------------------------------------- prompt files


def test_builtin_workloads_have_eight_or_more_distinct_prompts():
    seen = set()
    for name in workloads.WORKLOADS:
        w = workloads.builtin_workload(name)
        assert len(w.prompts) >= 8, name
        ids = [p.id for p in w.prompts]
        assert len(set(ids)) == len(ids)
        assert all(p.text.strip() for p in w.prompts)
        seen.update(p.text for p in w.prompts)
    assert len(seen) == sum(len(workloads.builtin_workload(n).prompts) for n in workloads.WORKLOADS)
    assert not workloads.builtin_workload("code").prompts[0].chat  # completion, not chat
    assert "```" in workloads.builtin_workload("edit").prompts[0].text  # the code to repeat is in the prompt


def test_plain_prompt_file_one_prompt_per_line(tmp_path):
    f = tmp_path / "mine.txt"
    f.write_text("first prompt\n\n  second prompt  \n", encoding="utf-8")
    w = workloads.load_prompts(f)
    assert [p.text for p in w.prompts] == ["first prompt", "second prompt"]
    assert [p.id for p in w.prompts] == ["mine-01", "mine-02"]
    assert w.name == "mine"


def test_jsonl_prompt_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a\\nb", "id": "x"}\n{"prompt": "c", "chat": false}\n', encoding="utf-8")
    w = workloads.load_prompts(f)
    assert w.prompts == [Prompt("x", "a\nb", True), Prompt("p-02", "c", False)]


@pytest.mark.parametrize(
    ("content", "line", "what"),
    [
        ('{"prompt": "ok"}\n\n{"prompt": "broken"\n', 3, "not valid JSON"),
        ('{"prompt": "ok"}\n{"text": "no prompt"}\n', 2, '"prompt"'),
        ('{"prompt": "ok"}\n["a list"]\n', 2, "JSON object"),
        ('{"prompt": ""}\n', 1, '"prompt"'),
        ('{"prompt": "ok", "chat": "yes"}\n', 1, '"chat"'),
    ],
)
def test_malformed_prompt_file_names_file_and_line(tmp_path, content, line, what):
    f = tmp_path / "bad.jsonl"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(BenchError) as exc:
        workloads.load_prompts(f)
    assert f"{f}:{line}:" in str(exc.value)
    assert what in str(exc.value)
    assert exc.value.hint


def test_missing_and_empty_prompt_files(tmp_path):
    with pytest.raises(BenchError, match="not found"):
        workloads.load_prompts(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(BenchError, match="no prompts"):
        workloads.load_prompts(tmp_path / "empty.txt")
    with pytest.raises(BenchError, match="unknown workload"):
        workloads.builtin_workload("poetry")


# ---------------------------------------------------------------------------------------------- arithmetic


def test_median():
    assert benchmath.median([3.0, 1.0, 2.0]) == 2.0
    assert benchmath.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert benchmath.median([float("nan"), 5.0]) == 5.0
    assert math.isnan(benchmath.median([]))


def test_interleaved_order():
    order = benchmath.interleaved_order(2, 3, repeats=2, warmup=True)
    assert order[:3] == [(0, 0, -1), (0, 1, -1), (0, 2, -1)]
    assert order[3:] == [
        (0, 0, 0),
        (0, 1, 0),
        (0, 2, 0),
        (0, 0, 1),
        (0, 1, 1),
        (0, 2, 1),
        (1, 0, 0),
        (1, 1, 0),
        (1, 2, 0),
        (1, 0, 1),
        (1, 1, 1),
        (1, 2, 1),
    ]
    assert benchmath.interleaved_order(0, 2, warmup=True) == []


def test_sequential_workload_runs_each_config_through_the_whole_session_in_order():
    calls = []

    def runner(prompt, cfg, n):
        calls.append((prompt.id, cfg.label))
        return _stats(10.0)

    session = Workload(
        "edit-session", [Prompt("s1", "a"), Prompt("s2", "b"), Prompt("s3", "c")], sequential=True
    )
    cfgs = [DraftSettings("ngram", 3)]
    bench.run_interleaved(runner, [session], cfgs, max_tokens=16, repeats=2, warmup=False)
    assert calls == [(p, c) for _ in range(2) for c in ("none", "ngram k=3") for p in ("s1", "s2", "s3")]
    # the limit keeps the flag (a cut session is still a session)
    assert session.limited(2).sequential and [p.id for p in session.limited(2).prompts] == ["s1", "s2"]
    assert benchmath.interleaved_order(2, 2, sequential=True) == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]


def _stats(tps: float, **kw) -> dict:
    gen = kw.pop("generated_tokens", 100)
    base = {"generated_tokens": gen, "tokens_per_second": tps, "total_seconds": gen / tps, "text": "same"}
    base.update(kw)
    return base


def _drafting_stats(tps: float, t: float, **kw) -> dict:
    """A k=4 draft model's run: 40 rounds, 160 drafted, 60 accepted, c = 0.4, V(5) = 2.2 (T = ``t`` s)."""
    return _stats(
        tps,
        rounds=40,
        drafted=160,
        accepted=60,
        draft_evals=160,
        draft_seconds=160 * 0.4 * t,
        verify_seconds=40 * 2.2 * t,
        verify_tokens=200,
        drafted_by_position=[40, 40, 40, 40],
        total_seconds=100 / tps,
        **kw,
    )


def test_run_interleaved_calls_baseline_then_each_setting_per_prompt():
    calls = []

    def runner(prompt, cfg, n):
        calls.append((prompt.id, cfg.label, n))
        return _stats(10.0)

    w = Workload("w", [Prompt("p1", "a"), Prompt("p2", "b")])
    cfgs = [DraftSettings("model", 3, p_min=0.75), DraftSettings("ngram", 3)]
    recs = bench.run_interleaved(runner, [w], cfgs, max_tokens=16, repeats=2, warmup=True)
    labels = [c[1] for c in calls]
    assert labels[:3] == ["none", "model k=3 p_min=0.75", "ngram k=3"]  # warm-up, short
    assert all(n == 8 for _, _, n in calls[:3]) and all(n == 16 for _, _, n in calls[3:])
    assert labels[3:] == ["none", "model k=3 p_min=0.75", "ngram k=3"] * 4
    assert [c[0] for c in calls[3:]] == ["p1"] * 6 + ["p2"] * 6
    assert sum(not r.counted for r in recs) == 3


def test_summary_medians_ceiling_and_loss_factors_multiply_to_efficiency():
    t = 0.1  # seconds per target token
    base = [
        (p, _stats(tps, rounds=100, verify_seconds=100 * t, total_seconds=100 * t * 1.05))
        for p, tps in (("a", 9.5), ("b", 9.0), ("c", 10.0))
    ]
    # ratios 2.0, 1.0, 1.2 -> median 1.2
    spec = [(p, _drafting_stats(tps, t)) for p, tps in (("a", 19.0), ("b", 9.0), ("c", 12.0))]
    cell = benchmath.summarise_cell("w", DraftSettings("model", 4, p_min=0.0), base, spec)  # a fixed length
    assert cell.speedup == pytest.approx(1.2)
    assert cell.baseline_tps == 9.5 and cell.speculative_tps == 12.0
    assert cell.acceptance_rate == pytest.approx(60 / 160)
    assert cell.mean_accepted_length == pytest.approx(1.5) and cell.tokens_per_round == pytest.approx(2.5)
    assert cell.identical_output == 1.0
    assert cell.c == pytest.approx(0.4) and cell.v_at_batch == pytest.approx(2.2) and cell.batch == 5.0
    line = benchmath.add_ceilings([cell])
    assert line == speed.VerifyLine(v2=2.2, slope=0.0)  # one point of 5 rows: a flat line through it
    line = speed.VerifyLine(v2=1.3, slope=0.3)  # V(5) = 2.2 as measured, V(2) = 1.3
    benchmath.add_ceilings([cell], line)
    assert cell.reach == []  # the runs counted nothing by position: the i.i.d. fit stands in
    a = speed.fit_acceptance(1.5, 4)
    assert cell.a == pytest.approx(a)
    reach = speed.iid_reach(a, 4)
    assert cell.v_k1 == pytest.approx(2.2)
    assert cell.ceiling == pytest.approx(speed.expected_tokens(reach, 4) / (4 * 0.4 + 2.2))
    # a = 0.46, c = 0.4: the best draft length in theory is shorter than the configured 4
    ceilings = {k: speed.expected_tokens(reach, k) / (k * 0.4 + line(k + 1)) for k in range(1, 5)}
    assert cell.best_k == max(ceilings, key=ceilings.get) < 4
    assert cell.best_ceiling == pytest.approx(max(ceilings.values())) and cell.best_ceiling > cell.ceiling
    assert cell.efficiency == pytest.approx(1.2 / cell.best_ceiling)
    assert math.prod(cell.losses.values()) == pytest.approx(cell.efficiency)
    assert cell.losses["baseline_overhead"] == pytest.approx(1.05)

    # The same runs as an adaptive setting: it picks its length per round (none included) and may end a draft
    # early, so its ceiling is the best over 0..k of rounds whose draft stops at its first rejected token:
    # never below the target alone, nor below a fixed length's.
    adaptive = benchmath.summarise_cell("w", DraftSettings("model", 4, p_min=0.75, adaptive=True), base, spec)
    benchmath.add_ceilings([adaptive], line)
    stopped = {
        k: speed.expected_tokens(reach, k)
        / (0.4 * speed.expected_tokens(reach, k - 1) + line(1 + speed.expected_tokens(reach, k - 1)))
        for k in range(1, 5)
    }
    assert adaptive.best_ceiling == pytest.approx(max(1.0, *stopped.values()))
    assert adaptive.best_ceiling >= cell.best_ceiling
    assert math.prod(adaptive.losses.values()) == pytest.approx(adaptive.efficiency)


def test_the_ceiling_reads_acceptance_per_position_pooled_over_a_strategys_cells():
    """A p_min stop cuts drafts short (counted as not accepted): the ceiling takes, per position, the most any
    cell of the same drafter on the same workload reached."""
    t = 0.1
    base = [("a", _stats(10.0, rounds=100, verify_seconds=100 * t, total_seconds=100 * t))]
    stopped = [("a", _drafting_stats(12.0, t, accepted_by_position=[30, 20, 10, 0]))]
    unstopped = [("a", _drafting_stats(11.0, t, accepted_by_position=[32, 16, 8, 4]))]
    cells = [
        benchmath.summarise_cell("w", DraftSettings("model", 4, p_min=0.75), base, stopped),
        benchmath.summarise_cell("w", DraftSettings("model", 4, p_min=0.0), base, unstopped),
    ]
    line = speed.VerifyLine(v2=1.3, slope=0.3)
    benchmath.add_ceilings(cells, line)
    assert cells[0].reach == [0.75, 0.5, 0.25, 0.0] and cells[1].reach == [0.8, 0.4, 0.2, 0.1]
    pooled = [0.8, 0.5, 0.25, 0.1]
    assert [c.expected_tokens for c in cells] == [pytest.approx(1 + sum(pooled))] * 2
    assert cells[1].ceiling == pytest.approx(2.65 / (4 * 0.4 + line(5)))  # p_min 0: four drafts a round
    # p_min 0.75 may stop: at best where the first draft is wrong, E(3) = 2.55 drafts a round
    assert cells[0].ceiling == pytest.approx(2.65 / (2.55 * 0.4 + line(3.55)))


# ---------------------------------------------------------------------------------------------- tuner


def test_tune_grid_and_honest_none():
    grid = tune.tune_configs(["model", "ngram", "none"], [1, 2, 3], [0.5, 0.9])
    assert len(grid) == 3 * 2 + 3
    assert [c.label for c in grid if c.strategy.name == "ngram"] == ["ngram k=1", "ngram k=2", "ngram k=3"]
    with pytest.raises(BenchError):
        tune.tune_configs(["magic"], [1], [0.5])
    order = bench.plan_configs(grid, baseline_every=4)
    assert order[0] == BASELINE and order[-1] == BASELINE and order.count(BASELINE) == 4
    assert tune.parse_int_range("1-3,6") == [1, 2, 3, 6]

    def slow(prompt, cfg, n):  # every speculative setting is slower than the target alone
        return _stats(10.0 if not cfg.is_speculative else 8.0 + (cfg.n_max or 0) * 0.1)

    w = Workload("w", [Prompt("p", "x")])
    res = tune.tune(slow, [w], grid, max_tokens=4)
    assert res.workloads["w"].winner.strategy == "none"
    assert "nothing beat the target alone" in res.workloads["w"].note
    assert tune.overall_winner(res).config == "none" and res.overall == tune.overall_winner(res)

    def fast_ngram(prompt, cfg, n):
        return _stats(15.0 if cfg.label == "ngram k=3" else 10.0)

    res = tune.tune(fast_ngram, [w], grid, max_tokens=4)
    assert (
        res.workloads["w"].winner.config == "ngram k=3" and res.workloads["w"].cells[0].config == "ngram k=3"
    )
    assert tune.overall_winner(res).speedup == pytest.approx(1.5)

    # --adaptive adds each strategy with the adaptive length, up to the longest draft swept
    grid = tune.tune_configs(["model", "ngram"], [1, 2, 3], [0.5, 0.9], adaptive=True)
    assert [c.label for c in grid if c.adaptive] == [
        "model k=3 p_min=0.5 adaptive",
        "model k=3 p_min=0.9 adaptive",
        "ngram k=3 adaptive",
    ]

    def fast_adaptive(prompt, cfg, n):
        return _stats(12.0 if cfg.label == "model k=3 p_min=0.9 adaptive" else 10.0)

    res = tune.tune(fast_adaptive, [w], grid, max_tokens=4)
    assert res.workloads["w"].winner.adaptive is True
    assert tune.overall_winner(res).adaptive is True


def _bench_error(parse, text):
    with pytest.raises(BenchError) as exc:
        parse(text)
    return exc.value


def test_sweep_lists_parse_in_order_once_each_within_runs_bounds():
    assert tune.parse_int_range("1-3,6") == [1, 2, 3, 6]
    assert tune.parse_int_range(" 6 , 2 - 4,3,") == [6, 2, 3, 4]  # the order given, each length once
    assert tune.parse_int_range("64") == [64] and tune.parse_int_range("1-64") == list(range(1, 65))
    assert tune.parse_p_min_list("0.9, .5,0.9,0,1,1e-1") == [0.9, 0.5, 0.0, 1.0, 0.1]
    assert str(tune.parse_p_min_list("-0")[0]) == "0.0"
    for text, what in [
        ("0-2", "not in the range 1<=x<=64"),
        ("65", "not in the range 1<=x<=64"),
        ("1-1000000000000", "not in the range 1<=x<=64"),  # refused, never expanded
        ("9" * 5000, "not in the range 1<=x<=64"),  # past what int() converts
        ("4-2", "runs backwards"),
        ("abc", "not a draft length"),
        ("1-8-9", "not a draft length"),
        ("-3", "not a draft length"),
        ("1.5", "not a draft length"),
        ("1_0", "not a draft length"),
        ("", "no draft lengths"),
        (" , ,", "no draft lengths"),
    ]:
        with pytest.raises(BenchError, match=re.escape(what)) as exc:
            tune.parse_int_range(text)
        assert exc.value.hint, text
    assert '"2-4"' in (_bench_error(tune.parse_int_range, "4-2").hint or "")
    for text, what in [
        ("1.5", "not in the range 0.0<=x<=1.0"),
        ("-0.1", "not in the range 0.0<=x<=1.0"),
        ("1e999", "not in the range 0.0<=x<=1.0"),
        ("nan", "not a finite number"),
        ("-inf", "not a finite number"),
        ("half", "not a number"),
        ("0.5;0.7", "not a number"),
        ("", "no p_min values"),
        ("0.75,0.7500001", "one setting in the reports (p_min=0.75)"),
    ]:
        with pytest.raises(BenchError, match=re.escape(what)) as exc:
            tune.parse_p_min_list(text)
        assert exc.value.hint, text


def test_sweep_size_counts_what_tune_configs_builds_and_check_sweep_caps_it():
    for strategies, ns, ps, adaptive in [
        (["model", "ngram", "none"], [1, 2, 3], [0.5, 0.9], False),
        (["model", "ngram", "none"], [1, 2, 3], [0.5, 0.9], True),
        (list(SPECULATIVE_STRATEGIES), list(range(1, 9)), [0.5, 0.75, 0.9], False),
        (["suffix", "auto"], [4], [0.1, 0.2, 0.3], True),
    ]:
        size = tune.sweep_size(strategies, ns, ps, adaptive)
        assert size == len(tune.tune_configs(strategies, ns, ps, adaptive)), strategies
    assert tune.sweep_size(PAIR_STRATEGIES, range(1, 9), [0.5, 0.75, 0.9]) == 96  # the default grid
    # repeats go, the order stays; None counts every drafting strategy
    assert tune.check_sweep(None, [3, 1, 3], [0.9, 0.5, 0.9]) == ([3, 1], [0.9, 0.5])
    assert tune.check_sweep(None, range(1, 65), [0.5, 0.75, 0.9]) == (list(range(1, 65)), [0.5, 0.75, 0.9])
    five = [0.1, 0.2, 0.3, 0.4, 0.5]
    with pytest.raises(BenchError, match=f"1152 settings per prompt.*more than {MAX_TUNE_SWEEP}") as exc:
        tune.check_sweep(None, range(1, 65), five)
    assert "--tune-n-max" in (exc.value.hint or "")
    assert tune.check_sweep(["ngram"], range(1, 65), five)[0] == list(range(1, 65))  # ngram ignores p_min
    for ns, ps in [
        ([], [0.5]),
        ([1], []),
        ([0], [0.5]),
        ([1], [2.0]),
        ([True], [0.5]),
        ([1], [float("nan")]),
    ]:
        with pytest.raises(BenchError):
            tune.check_sweep(None, ns, ps)


def test_tune_benchmark_checks_the_sweep_before_the_pair_loads(monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("the pair was loaded for a sweep that cannot run")

    monkeypatch.setattr(tune, "open_pipeline", no_load)
    monkeypatch.setattr(tune, "load_workloads", no_load)
    with pytest.raises(BenchError, match="not in the range 1<=x<=64"):
        tune.tune_benchmark(n_max_values=[0, 1])
    with pytest.raises(BenchError, match="not in the range 0.0<=x<=1.0"):
        tune.tune_benchmark(p_min_values=[1.5])
    with pytest.raises(BenchError, match="settings per prompt"):
        tune.tune_benchmark(n_max_values=range(1, 65), p_min_values=[0.1, 0.2, 0.3, 0.4, 0.5])


def test_save_winners_writes_loadable_user_presets(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_CONFIG", str(tmp_path / "cfg"))
    from localspec.hub.presets import get_preset

    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    rep = _report_from(
        [],
        pair={"target": str(t), "draft": str(d), "n_ctx": 2048},
        tuning=Tuning.from_dict(
            {
                "overall": {
                    "config": "ngram k=5",
                    "strategy": "ngram",
                    "n_max": 5,
                    "p_min": None,
                    "speedup": 1.3,
                },
                "workloads": {
                    "chat": {
                        "winner": {
                            "config": "none",
                            "strategy": "none",
                            "n_max": None,
                            "p_min": None,
                            "speedup": 1.0,
                        }
                    },
                    "edit": {
                        "winner": {
                            "config": "model k=3 p_min=0.5",
                            "strategy": "model",
                            "n_max": 3,
                            "p_min": 0.5,
                            "speedup": 1.1,
                        }
                    },
                    "code": {
                        "winner": {
                            "config": "model k=6 p_min=0.7 adaptive",
                            "strategy": "model",
                            "n_max": 6,
                            "p_min": 0.7,
                            "adaptive": True,
                            "speedup": 1.2,
                        }
                    },
                },
            },
            [],
        ),
    )
    paths = tune.save_winners(rep, "my-tuned")
    assert len(paths) == 4 and all(Path(p).is_file() for p in paths)
    assert rep.tuning is not None and rep.tuning.replaced == []
    p = get_preset("my-tuned")
    assert (p.draft.strategy.name, p.draft.n_max) == ("ngram", 5)
    assert get_preset("my-tuned-chat").draft.strategy.name == "none"
    e = get_preset("my-tuned-edit")
    assert (e.draft.strategy.name, e.draft.n_max, e.draft.p_min) == ("model", 3, 0.5)
    assert e.n_ctx == 2048 and str(e.target.path) == str(t)
    assert not e.draft.adaptive and get_preset("my-tuned-code").draft.adaptive
    # a second save over the same names says which paths held a preset before (the CLI prints "replaced")
    Path(paths[1]).unlink()
    again = tune.save_winners(rep, "my-tuned")
    assert again == paths and rep.tuning.replaced == [paths[0], *paths[2:]]


# ---------------------------------------------------------------------------------------------- reports


def test_a_tuned_report_reads_back_as_the_records_it_was_written_from():
    """bench.json keeps the runs (their text cut) and the sweep (each tuned workload's cells by name, the
    winners); read back, they are the same records, the sweep's cells those of the report."""
    w = Workload("w", [Prompt("p", "x")])
    grid = tune.tune_configs(["ngram"], [1, 2, 3], [0.5])

    def fast_ngram(prompt, cfg, n):
        return _stats(15.0 if cfg.label == "ngram k=2" else 10.0, text="y" * 500)

    tuning = tune.tune(fast_ngram, [w], grid, max_tokens=4)
    cells = tuning.workloads["w"].cells
    runs = bench.run_interleaved(fast_ngram, [w], grid[:1], max_tokens=4, warmup=False)
    rep = _report_from(cells, tuning=tuning, runs=runs)
    back = report.BenchReport.from_json(json.loads(json.dumps(rep.as_json())))
    assert back.tuning is not None and back.tuning.as_dict() == tuning.as_dict()
    assert back.tuning.overall.config == "ngram k=2"
    assert [c.config for c in back.tuning.workloads["w"].cells] == ["ngram k=2", "ngram k=1", "ngram k=3"]
    assert [id(c) for c in back.tuning.workloads["w"].cells] == [id(c) for c in back.cells]  # the report's
    assert back.runs == [replace(r, stats={**r.stats, "text": "y" * report.RUN_TEXT_CHARS}) for r in runs]


def _report_from(cells, **extra) -> report.BenchReport:
    extra.setdefault("pair", {"target": "t.gguf", "draft": "d.gguf"})
    return report.BenchReport(
        machine=report.machine_info(2),
        settings={"max_tokens": 8, "temperature": 0.0, "repeats": 1},
        memory={
            "draft_overhead_bytes": 5 * 10**6,
            "draft_overhead_pct": 25.0,
            "draft_weights_bytes": 4 * 10**6,
            "draft_kv_bytes": 10**6,
            "draft_rss_delta_bytes": 3 * 10**6,
        },
        cells=list(cells),
        **extra,
    )


def _cell(**kw) -> benchmath.CellResult:
    """A cell with every required field filled (a drafting model row, 1.3x), overridden by ``kw``."""
    values = dict(
        **dict.fromkeys(["p_min", "identical_output"]),
        **dict.fromkeys(["prompts", "drafting_rounds", "generated_tokens"], 10),
        **dict.fromkeys(["baseline_tps", "speculative_tps", "draft_share", "verify_share"], 1.0),
        **dict.fromkeys(["other_share", "prompt_seconds_baseline", "prompt_seconds_speculative"], 1.0),
        **dict.fromkeys(["mean_accepted_length", "tokens_per_round", "draft_length"], 3.0),
        workload="code",
        config="model k=4",
        strategy="model",
        n_max=4,
        speedup=1.3,
        speedup_per_prompt=[1.3],
        acceptance_rate=0.8,
        a=0.8,
        c=0.5,
    )
    values.update(kw)
    return benchmath.CellResult(**values)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_report_files_written_and_parseable(tmp_path):
    base = [("a", _stats(10.0, rounds=100, verify_seconds=9.0))]
    spec = [
        (
            "a",
            _stats(
                12.0,
                rounds=50,
                drafted=100,
                accepted=50,
                verify_seconds=6.0,
                verify_tokens=150,
                drafted_by_position=[50, 50],
            ),
        )
    ]
    cells, _ = benchmath.summarise(
        [Workload("edit", [Prompt("a", "x")])],
        [DraftSettings("ngram", 2)],
        [
            RunRecord("localspec", "edit", "a", "none", 0, base[0][1]),
            RunRecord("localspec", "edit", "a", "ngram k=2", 0, spec[0][1]),
        ],
    )
    theirs = [
        replace(cells[0], speedup=1.1, acceptance_rate=0.4, speculative_tps=11.0),
        replace(cells[0], speedup=0.9, acceptance_rate=0.3, config="ngram k=3", n_max=3, speculative_tps=9.0),
    ]
    rep = _report_from(cells, peer=report.PeerResult(theirs, "test peer"))
    files = report.write_all(rep, tmp_path / "out")
    data = json.loads(files["json"].read_text())
    assert data["cells"][0]["config"] == "ngram k=2" and data["cells"][0]["speedup"] == pytest.approx(1.2)
    md = files["markdown"].read_text()
    assert "## code edit" in md and "| config |" in md and "1.20x" in md
    assert "1.10x (40%, k=2)" in md  # llama.cpp at its best of the same strategy
    assert "ours/llama.cpp" in md and "1.09" in md  # 1.2 / 1.1
    assert "edit: ours at its best (ngram k=2) / llama.cpp at its best (ngram k=2): 1.09 (tokens/s)" in md
    # bench.json reads back as the same report (--from-json)
    again = report.read_json(files["json"])
    assert again.cells[0].speedup == pytest.approx(1.2) and again.peer and again.peer.note == "test peer"
    assert report.format_text(again) == report.format_text(report.BenchReport.from_json(rep.as_json()))
    assert "Draft memory: +5.0 MB" in md and "weights 4.0 MB + KV 1.0 MB" in md  # units.format_bytes
    w, h = _png_size(files["png"])
    assert w == 900 and 100 < h < 2000
    text = report.format_text(rep)
    assert "code edit" in text and "ngram k=2" in text
    assert "warning" not in text, text


def test_figures_no_drafter_can_produce_are_flagged_as_noise():
    """From a run beside another busy process: a model row at 603% of its ceiling, an n-gram row that
    accepted nothing yet ran 5.3x: the report says they are noise rather than print them as results."""
    rows = [
        _cell(workload="code", config="model k=4", speedup=5.5, efficiency=6.03, acceptance_rate=0.5),
        _cell(workload="code", config="ngram k=4", speedup=5.26, acceptance_rate=0.0),
        _cell(workload="chat", config="ngram k=4", speedup=1.1, acceptance_rate=0.0),
        _cell(workload="chat", config="model k=4", speedup=0.9, efficiency=1.05, acceptance_rate=0.9),
    ]
    (line,) = report.noise_lines(_report_from(rows))
    assert "code / model k=4 5.50x is 603% of its ceiling" in line
    assert "code / ngram k=4 5.26x with no draft accepted" in line
    assert "chat" not in line and "--repeats 3" in line
    assert report.noise_lines(_report_from(rows[2:])) == []
    busy = speed.VerifyLine(v2=1.5, slope=282.7)
    (line,) = report.noise_lines(_report_from(rows[2:], verify_line=busy))
    assert "each extra token of a verify pass fitted at 283 one-token passes" in line


def test_a_recurrent_targets_rollback_lowers_the_ceiling():
    """State copies per drafting round and replayed rows count in the ceiling (0 for a transformer)."""
    t = 0.1
    base = [("a", _stats(10.0, rounds=100, verify_seconds=100 * t, total_seconds=100 * t))]

    def spec(rollback_seconds, replayed):
        return [("a", _drafting_stats(12.0, t, rollback_seconds=rollback_seconds, replayed_tokens=replayed))]

    plain = benchmath.summarise_cell("w", DraftSettings("model", 4, p_min=0.0), base, spec(0.0, 0))
    hybrid = benchmath.summarise_cell(
        "w", DraftSettings("model", 4, p_min=0.0), base, spec(40 * 0.05 * t, 40)
    )
    line = speed.VerifyLine(v2=1.3, slope=0.3)
    benchmath.add_ceilings([plain, hybrid], line)
    assert plain.rollback_copies == 0.0 and hybrid.rollback_copies == pytest.approx(0.05)
    assert hybrid.replayed_per_round == pytest.approx(1.0)
    tokens = speed.expected_tokens(speed.iid_reach(plain.a, 4), 4)
    assert plain.ceiling == pytest.approx(tokens / (4 * 0.4 + line(5)))
    rollback = 0.05 + 0.3 * 1.0  # the copies, and one replayed row per drafting round
    assert hybrid.ceiling == pytest.approx(tokens / (4 * 0.4 + line(5) + rollback))
    assert hybrid.ceiling < plain.ceiling and hybrid.best_ceiling < plain.best_ceiling


def test_a_non_physical_verify_fit_gives_no_ceiling():
    """Beside a busy process the fit gave V(b) = 1 + 282 (b - 1): ceilings of 0.00x, efficiencies of
    222094%, shown as results. A slope past one pass per token gives none."""
    from localspec.bench.arithmetic import add_ceilings

    def cell(strategy, batch, v):
        return _cell(config=strategy, strategy=strategy, batch=batch, v_at_batch=v)

    busy = [cell("model", 2.0, 2.0), cell("model", 5.0, 1130.0)]
    assert add_ceilings(busy).slope > 200 and busy[0].ceiling is None and busy[0].efficiency is None
    calm = [cell("model", 2.0, 1.4), cell("model", 5.0, 2.6)]
    assert add_ceilings(calm).slope == pytest.approx(0.4) and calm[0].ceiling and calm[0].efficiency


# ---------------------------------------------------------------------------------------------- the peer


def test_peer_server_flags_match_our_settings(tmp_path):
    from localspec.bench import peer

    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    args = peer.server_args(DraftSettings("model", 5, p_min=0.6), target=t, draft=d, threads=2, n_ctx=2048)
    s = " ".join(args)
    assert f"--model {t}" in s and f"--model-draft {d}" in s and "--spec-type draft-simple" in s
    assert "--spec-draft-n-max 5" in s and "--spec-draft-p-min 0.6" in s and "--threads 2" in s
    assert "-c 2048" in s and "--cache-ram 0" in s
    s = " ".join(peer.server_args(DraftSettings("ngram", 2), target=t, draft=None, threads=2, n_ctx=512))
    assert (
        "--spec-type ngram-simple" in s and "--spec-ngram-simple-size-m 2" in s and "--model-draft" not in s
    )
    assert "--spec-type" not in " ".join(peer.server_args(BASELINE, target=t, draft=d, threads=2, n_ctx=512))
    with pytest.raises(BenchError):
        peer.server_args(DraftSettings("model+ngram", 3, p_min=0.5), target=t, draft=d, threads=2, n_ctx=512)


def test_peer_is_built_with_the_cpu_features_of_the_installed_wheel(monkeypatch):
    """A native peer next to an AVX2 wheel compares builds (1.066x measured here), not engines."""
    from localspec.llama import programs
    from localspec.llama.build import cpu_flags

    avx2 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 |"
    flags = cpu_flags(avx2)
    assert flags[0] == "-DGGML_NATIVE=OFF"
    assert {"-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_AVX512=OFF", "-DGGML_AMX_INT8=OFF"} <= set(flags)
    native = avx2 + " AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | OPENMP = 1 |"
    assert {
        "-DGGML_AVX512=ON",
        "-DGGML_AVX512_VNNI=ON",
        "-DGGML_AMX_TILE=ON",
        "-DGGML_AVX512_BF16=OFF",
    } <= set(cpu_flags(native))
    assert cpu_flags("CPU : NEON = 1 | ARM_FMA = 1 | DOTPROD = 1 | REPACK = 1 |") == []
    # the installed wheel's features are read; another set of flags builds into another folder
    monkeypatch.setattr(programs, "installed_system_info", lambda: avx2)
    monkeypatch.setenv("CMAKE_ARGS", "")
    assert "-DGGML_AVX512=OFF" in programs.build_flags()
    assert programs.build_dir("0.0") != programs.build_dir("0.0", programs.build_flags()[:-1])
    assert programs.build_dir("0.0") == programs.build_dir("0.0", programs.build_flags())
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_CUDA=on")
    assert programs.build_flags()[-1] == "-DGGML_CUDA=on"


# ---------------------------------------------------------------------------------------------- end to end


def test_bench_on_embedded_pair_in_process(embedded_pipe, tmp_path):
    ws = [
        Workload("code", workloads.builtin_workload("code").prompts[:1]),
        Workload("edit", workloads.builtin_workload("edit").prompts[:1]),
    ]
    cfgs = [DraftSettings("model", 3, p_min=0.5), DraftSettings("ngram", 3)]
    recs = bench.run_interleaved(bench.engine_runner(embedded_pipe), ws, cfgs, max_tokens=12)
    counted = [r for r in recs if r.counted]
    assert [r.config for r in counted] == ["none", "model k=3 p_min=0.5", "ngram k=3"] * 2
    for r in counted:
        assert r.stats["generated_tokens"] > 0 and r.stats["tokens_per_second"] > 0
    cells, _ = benchmath.summarise(ws, cfgs, recs)
    assert {(c.workload, c.strategy) for c in cells} == {
        (w, s) for w in ("code", "edit") for s in ("model", "ngram")
    }
    for c in cells:
        assert c.speedup > 0 and 0.0 <= c.acceptance_rate <= 1.0
        assert c.draft_share + c.verify_share <= 1.0 + 1e-9
        assert c.identical_output is not None
    model_cells = [c for c in cells if c.strategy == "model"]
    assert all(c.c > 0 for c in model_cells)
    # The fitted verify line rests on microsecond timings here and can come out non-physical (then no
    # ceiling, by design); with a given line every cell that drafted gets one.
    cells, _ = benchmath.summarise(ws, cfgs, recs, line=speed.VerifyLine(v2=1.3, slope=0.3))
    assert all(c.ceiling and c.best_k for c in cells if c.drafting_rounds)
    rep = _report_from(cells)
    files = report.write_all(rep, tmp_path)
    assert json.loads(files["json"].read_text())["cells"]


def test_bench_command_end_to_end(tmp_path):
    from click.testing import CliRunner

    from localspec.cli.bench import bench as bench_cmd

    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\nreturn a + b\n", encoding="utf-8")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        bench_cmd,
        [
            "--prompts",
            str(prompts),
            "--max-tokens",
            "8",
            "--threads",
            "2",
            "--n-ctx",
            "512",
            "--adaptive",
            "--out",
            str(out),
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "speedup" in result.output and "wrote" in result.output
    data = json.loads((out / "bench.json").read_text())
    assert data["settings"]["prompts"] == {"p": 2}
    assert {c["strategy"] for c in data["cells"]} == {"model", "ngram"}
    labels = {c["config"] for c in data["cells"]}
    assert {lbl for lbl in labels if lbl.endswith(" adaptive")} == {
        lbl + " adaptive" for lbl in labels if not lbl.endswith(" adaptive")
    }
    assert data["memory"]["draft_overhead_bytes"] > 0
    assert (out / "bench.md").read_text().startswith("# localspec bench")
    _png_size(out / "bench.png")

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n{oops\n', encoding="utf-8")
    from localspec.cli import main  # through the command group, as a user runs it: errors become messages

    result = CliRunner().invoke(main, ["bench", "--prompts", str(bad), "--out", str(out)])
    assert result.exit_code == 1
    assert f"{bad}:2:" in result.output and "not valid JSON" in result.output


@pytest.mark.parametrize(
    ("args", "option", "accepted"),
    [
        (["--repeats", "0"], "--repeats", "1<=x<=100"),
        (["--limit", "0"], "--limit", "x>=1"),  # nothing documents 0 as "all"; without --limit: all
        (["--limit", "-1"], "--limit", "x>=1"),
        (["--threads", "0"], "--threads", f"1<=x<={max_threads()}"),
        (["-n", "0"], "--max-tokens", "x>=1"),
        (["--n-max", "0"], "--n-max", "1<=x<=64"),
        (["--p-min", "5"], "--p-min", "0.0<=x<=1.0"),
        (["--p-min", "nan"], "--p-min", "not a finite number"),
        (["--n-ctx", "1"], "--n-ctx", "16<=x<=1048576"),
        (["--temperature", "-1"], "--temperature", "x>=0.0"),
        (["--sessions", "agent", "--repeats", "0"], "--repeats", "1<=x<=100"),
    ],
)
def test_bench_refuses_what_run_refuses_before_anything_loads(monkeypatch, tmp_path, args, option, accepted):
    """The same bounds as `run` (one declaration), so a usage error: exit 2, the accepted range named."""
    from click.testing import CliRunner

    import localspec
    from localspec.cli import main

    def no_load(*a, **k):
        raise AssertionError("a model was loaded for an invalid option")

    monkeypatch.setattr(bench, "benchmark", no_load)
    monkeypatch.setattr(localspec, "load", no_load)
    res = CliRunner().invoke(main, ["bench", "-q", "--out", str(tmp_path / "out"), *args])
    assert res.exit_code == 2, res.output
    assert f"Invalid value for '{option}'" in res.output and accepted in res.output
    assert not (tmp_path / "out").exists()
    run_res = CliRunner().invoke(main, ["run", *args[-2:], "x"]) if option != "--limit" else None
    if run_res is not None and option != "--repeats":  # `run` words it the same way
        assert run_res.exit_code == 2 and res.output.splitlines()[-1] == run_res.output.splitlines()[-1]


def test_bench_help_shows_the_ranges():
    from click.testing import CliRunner

    from localspec.cli import main

    text = " ".join(CliRunner().invoke(main, ["bench", "--help"]).output.split())
    for option, accepted in [
        ("--limit", "[x>=1]"),
        ("--repeats", "1<=x<=100]"),
        ("--threads", f"[1<=x<={max_threads()}]"),
        ("--max-tokens", "x>=1]"),
        ("--n-ctx", "[16<=x<=1048576]"),
        ("--n-max", "[1<=x<=64]"),
        ("--p-min", "[0.0<=x<=1.0]"),
    ]:
        shown = re.search(rf"{option} [A-Z ]+ [^[]*(\[[^]]*\])", text)  # the first [...] after it
        assert shown and accepted in shown[1], (option, shown)


@pytest.fixture
def no_model_loads(monkeypatch):
    """Every way `bench` reaches a model raises, so a refusal that came late shows as exit 1, not 2."""
    import localspec
    from localspec.pipeline import loading

    def no_load(*a, **k):
        raise AssertionError("a model was loaded for an invalid option")

    for module, name in [
        (localspec, "load"),
        (loading, "load"),
        (bench, "open_pipeline"),
        (bench, "benchmark"),
        (tune, "open_pipeline"),
        (tune, "tune_benchmark"),
    ]:
        monkeypatch.setattr(module, name, no_load)


_SIX_STRATEGIES_64_LENGTHS = ["--tune-n-max", "1-64", "--tune-p-min", "0.1,0.2,0.3,0.4,0.5"]


@pytest.mark.parametrize(
    ("args", "option", "says"),
    [
        (["--tune-n-max", "0-2"], "--tune-n-max", ["'0-2' is not in the range 1<=x<=64", '"1-8"']),
        (["--tune-n-max", "65"], "--tune-n-max", ["'65' is not in the range 1<=x<=64"]),
        (["--tune-n-max", "1-1000000000000"], "--tune-n-max", ["'1-1000000000000'", "1<=x<=64"]),
        (["--tune-n-max", "4-2"], "--tune-n-max", ["'4-2' runs backwards", '"2-4"']),
        (["--tune-n-max", "1-8x"], "--tune-n-max", ["'1-8x' is not a draft length", "1<=x<=64", '"2,4,6"']),
        (["--tune-n-max", "-3"], "--tune-n-max", ["'-3' is not a draft length", "1<=x<=64"]),
        (["--tune-n-max", ","], "--tune-n-max", ["no draft lengths in ','", "1<=x<=64"]),
        (["--tune-n-max="], "--tune-n-max", ["no draft lengths in ''", "1<=x<=64"]),
        (["--tune-p-min", "1.5"], "--tune-p-min", ["'1.5' is not in the range 0.0<=x<=1.0"]),
        (["--tune-p-min", "0.5,-0.1"], "--tune-p-min", ["'-0.1' is not in the range 0.0<=x<=1.0"]),
        (["--tune-p-min", "nan"], "--tune-p-min", ["'nan' is not a finite number", "0.0<=x<=1.0"]),
        (["--tune-p-min", "0.5 0.9"], "--tune-p-min", ["'0.5 0.9' is not a number", '"0.5,0.75,0.9"']),
        (["--tune-p-min="], "--tune-p-min", ["no p_min values in ''", "0.0<=x<=1.0"]),
        (["--tune-p-min", "0.75,0.7500001"], "--tune-p-min", ["one setting in the reports"]),
        (
            _SIX_STRATEGIES_64_LENGTHS,
            "--tune-n-max' / '--tune-p-min",
            ["1152 settings per prompt (6 strategies", "more than 1024"],
        ),
        (
            [
                "--strategy",
                "model",
                "--tune-n-max",
                "1-64",
                "--tune-p-min",
                ",".join(f"0.{i:02}" for i in range(17)),
            ],
            "--tune-n-max' / '--tune-p-min",
            ["1088 settings per prompt (1 strategy, 64 draft lengths, 17 p_min values"],
        ),
        (["--save-preset", "My Pair"], "--save-preset", ["'My Pair' may only hold", '"my-pair-7b"']),
        # a user preset replaces a built-in one: saving as the embedded pair's changed what plain `run` does
        (
            ["--save-preset", "tiny-embedded"],
            "--save-preset",
            ["would hide the built-in preset 'tiny-embedded'"],
        ),
    ],
)
def test_bench_refuses_a_bad_sweep_before_anything_loads(no_model_loads, tmp_path, args, option, says):
    """A usage error (exit 2) naming the option, the value and what to type instead, and no model loaded."""
    from click.testing import CliRunner

    from localspec.cli import main

    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["bench", "--tune", "-q", "--out", str(out), *args])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert f"Invalid value for '{option}'" in said, res.output
    for text in says:
        assert text in said, (text, res.output)
    assert "Traceback" not in res.output and not out.exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--tune-n-max", "2,4"], "--tune-n-max needs --tune"),
        (["--tune-p-min", "0.5"], "--tune-p-min needs --tune"),
        (["--tune-n-max", "0"], "Invalid value for '--tune-n-max': '0' is not in the range 1<=x<=64"),
        (["--out", "{file}/sub"], "Invalid value for '--out'"),
        (["--sessions", "agent", "--out", "{file}/sub"], "is a file; give --out a folder path"),
        pytest.param(
            ["--out", "/proc/localspec-bench"],  # access() says yes to root here: the folder is made first
            "'/proc/localspec-bench' cannot be written",
            marks=pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc"),
        ),
        (["--workloads", "code,,chat"], "--workloads has an empty name"),
        (["--draft", "none", "--strategy", "model"], "drafts with a model, and --draft none"),
        (["--sessions", ""], "--sessions has an empty name"),
        (["--sessions", "agent", "--temperature", "0.7"], "--temperature does not apply with --sessions: "),
        (["--sessions", "agent", "--strategy", "ngram"], "--strategy does not apply with --sessions: "),
        (["--sessions", "agent", "--tune"], "--tune does not apply with --sessions: "),
        (["--sessions", "agent", "--wide-target", "F16"], "--wide-target does not apply with --sessions: "),
        (
            ["--sessions", "agent", "--limit", "2"],
            "--limit does not apply with --sessions: it cuts single-prompt workloads; every request",
        ),
        (
            ["--tune", "--repeats", "3"],
            "--repeats does not apply with --tune: the tuner runs each setting once",
        ),
        (
            ["--tune", "--n-max", "4"],
            "--n-max does not apply with --tune: the tuner sweeps draft lengths: give",
        ),
        (["--tune", "--no-warmup"], "--no-warmup does not apply with --tune: "),
    ],
)
def test_bench_refuses_ignored_or_unwritable_options_before_anything_loads(
    no_model_loads, tmp_path, args, says
):
    from click.testing import CliRunner

    from localspec.cli import main

    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    args = [a.replace("{file}", str(a_file)) for a in args]
    res = CliRunner().invoke(main, ["bench", "-q", *args])
    assert res.exit_code == 2, res.output
    assert says in " ".join(res.output.split()), res.output


def test_session_bench_caps_requests_only_when_asked_and_prints_json(monkeypatch, tmp_path):
    import contextlib
    from types import SimpleNamespace

    from click.testing import CliRunner

    import localspec
    from localspec.bench import session_run as session_bench
    from localspec.cli import main

    seen: list[dict] = []

    @contextlib.contextmanager
    def fake_load(**kw):
        assert kw["suffix_store"] is False  # the bench never touches the user's store
        yield SimpleNamespace(info=SimpleNamespace(draft_path=None))

    def fake_run(pipe, names, **kw):
        seen.append({"names": names, **kw})
        return [{"workload": names[0], "repeats": kw["repeats"], "rows": []}]

    monkeypatch.setattr(localspec, "load", fake_load)
    monkeypatch.setattr(session_bench, "run_bench", fake_run)
    monkeypatch.setattr(session_bench, "markdown", lambda results: "THE TABLE")
    base = ["bench", "--sessions", "agent", "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(main, [*base, "-q"])
    assert res.exit_code == 0 and "THE TABLE" in res.output, res.output
    assert seen[-1]["max_tokens"] is None and seen[-1]["repeats"] == 1  # each request's own length
    assert "note: one repeat" in res.stderr  # nothing to tell noise by: said
    res = CliRunner().invoke(main, [*base, "-n", "16", "--repeats", "2", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == [{"workload": "agent", "repeats": 2, "rows": []}]  # only the JSON
    assert seen[-1]["max_tokens"] == 16 and seen[-1]["repeats"] == 2
    assert json.loads((tmp_path / "out" / "sessions.json").read_text()) == json.loads(res.stdout)


def test_good_sweep_values_reach_the_tuner_parsed(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from localspec.cli import main

    seen: list[dict] = []

    def fake_tune(**kw):
        seen.append(kw)
        raise BenchError("stopped by the test", hint="none needed")

    monkeypatch.setattr(tune, "tune_benchmark", fake_tune)
    base = ["bench", "--tune", "-q", "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(main, [*base, "--tune-n-max", "6, 2-3,3", "--tune-p-min", "0.9,.5,0.9"])
    assert res.exit_code == 1 and "stopped by the test" in res.output, res.output
    assert seen[-1]["n_max_values"] == [6, 2, 3] and seen[-1]["p_min_values"] == [0.9, 0.5]
    res = CliRunner().invoke(main, base)  # the defaults go through the same parser
    assert seen[-1]["n_max_values"] == list(range(1, 9)) and seen[-1]["p_min_values"] == [0.5, 0.75, 0.9]
    # the whole n_max range is a sweep that fits with one strategy, and a sound preset name passes
    res = CliRunner().invoke(
        main, [*base, "--tune-n-max", "1-64", "--strategy", "ngram", "--save-preset", "my-pair.v2"]
    )
    assert res.exit_code == 1 and seen[-1]["n_max_values"] == list(range(1, 65)), res.output
    assert len(seen) == 3


def test_bench_help_shows_the_sweep_forms_and_bounds():
    from click.testing import CliRunner

    from localspec.cli import main

    text = " ".join(CliRunner().invoke(main, ["bench", "--help"]).output.split())
    # (help wraps lines after a hyphen: "comma- separated")
    assert re.search(r"--tune-n-max LENGTHS .*a range and/or a comma- ?separated list, each 1<=x<=64", text)
    assert re.search(r"--tune-p-min VALUES .*a comma- ?separated list, each 0\.0<=x<=1\.0", text)
    assert "e.g. 1-8 or 2,4,6" in text and "e.g. 0.5,0.75,0.9" in text
    assert f"at most {MAX_TUNE_SWEEP} settings per prompt" in text


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CI") == "true", reason="the llama.cpp peer never runs in CI")
def test_peer_on_embedded_pair(tmp_path):
    from localspec.llama import programs

    if programs.server_binary() is None:
        pytest.skip("no llama-server: set LOCALSPEC_PEER_DIR to where `localspec bench --peer` built it")
    rep = bench.benchmark(workloads=["edit"], limit=1, max_tokens=8, threads=2, n_ctx=512, peer=True)
    pc = rep["peer"]["cells"]
    assert {c["strategy"] for c in pc} == {"model", "ngram"}
    assert all(c["speculative_tps"] > 0 for c in pc)


def test_a_build_without_this_cpus_features_is_named_after_a_speed_report(monkeypatch, tmp_path):
    """A prebuilt or AVX2-only llama-cpp-python on an AVX-512 CPU makes wide verify passes ~1.5x dearer
    (measured here): the bench names the features the build leaves out, never AMX (it dies on some VMs)."""
    from localspec.llama import build

    avx2_build = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | OPENMP = 1 |"
    cpu = "processor : 0\nflags\t\t: fpu sse3 avx avx2 fma f16c bmi2 avx512f avx512_vnni amx_tile amx_int8\n"
    assert build.unused_cpu_features(avx2_build, cpu) == ["AVX512", "AVX512_VNNI"]
    native = avx2_build + " AVX512 = 1 | AVX512_VNNI = 1 |"
    assert build.unused_cpu_features(native, cpu) == []
    assert build.unused_cpu_features(avx2_build, "processor : 0\nFeatures : neon\n") == []  # not x86
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(cpu)
    monkeypatch.setattr(build, "installed_system_info", lambda: avx2_build)
    note = build.build_note(cpuinfo)
    assert note is not None and "AVX512, AVX512_VNNI," in note and "AMX" not in note
    assert "Troubleshooting" in note
    monkeypatch.setattr(build, "installed_system_info", lambda: native)
    assert build.build_note(cpuinfo) is None
    assert build.build_note(tmp_path / "missing") is None  # not Linux: no note, no error


@pytest.mark.skipif(os.name != "posix", reason="process groups")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_an_interrupted_peer_build_takes_its_compilers_with_it(tmp_path, sig):
    """subprocess.call killed only cmake; make and the compilers under it went on, re-parented to init."""
    import signal
    import subprocess
    import sys
    import time

    pidfile = tmp_path / "grandchild.pid"
    build = ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]
    # Python's own Ctrl-C handler, as a terminal's Python has it: a test run started in the background of a
    # non-interactive shell (`pytest &`) inherits SIGINT ignored, and the child would never see the signal
    script = (
        "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from localspec.llama.processes import call_as_group\n"
        f"call_as_group({build!r}, cwd=None, stdout=None)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    proc.send_signal(getattr(signal, sig))  # to localspec's pid alone, as `timeout` or `kill` sends it
    assert proc.wait(30) != 0
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(grandchild, signal.SIGKILL)
        raise AssertionError("the build's grandchild outlived the interrupted build")


def test_a_prompt_too_long_for_the_context_is_named_before_the_first_run(tmp_path):
    """Found mid-run, it ended minutes of benchmarking with the API's message and no prompt named."""
    from localspec.bench.single import benchmark
    from localspec.errors import BenchError

    prompts = tmp_path / "mine.txt"
    prompts.write_text("def g():\n" + "def f(): return 1 " * 2000 + "\n")
    with pytest.raises(BenchError) as err:
        benchmark(prompts_file=prompts, max_tokens=4, threads=2, strategies=["ngram"])
    assert "prompt 'mine-02' of mine is" in err.value.message and "--max-tokens 4" in err.value.message
    assert "raise --n-ctx" not in (err.value.hint or "")  # the embedded pair is at its trained context


# ---------------------------------------------------------------------------------------------- saved runs

_RESULTS = Path(__file__).resolve().parent.parent


def _saved_bench_runs() -> list[Path]:
    """Every committed bench.json (a report with cells and the run records behind them)."""
    out = []
    for folder in (_RESULTS / "docs" / "results", _RESULTS / "tests" / "data"):
        for path in sorted(folder.rglob("*.json")):
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and "cells" in data and (data.get("runs") or data.get("records")):
                out.append(path)
    return out


@pytest.mark.parametrize(
    "path",
    _saved_bench_runs()
    or [
        pytest.param(
            None, marks=pytest.mark.skip(reason="no bench run is committed (docs/results, tests/data)")
        )
    ],
)
def test_no_saved_run_beats_its_ceiling(path):
    """The model of speed replayed on each saved run's records: no setting above 100% of its ceiling."""
    data = json.loads(path.read_text(encoding="utf-8"))
    saved = report.BenchReport.from_json(data)
    runs = [RunRecord.from_dict(r) for r in data.get("runs") or data.get("records")]
    configs = list(
        {
            c.config: DraftSettings(c.strategy, c.n_max or 1, p_min=c.p_min or 0.0, adaptive=c.adaptive)
            for c in saved.cells
        }.values()
    )
    workloads_run = [Workload(w, []) for w in dict.fromkeys(c.workload for c in saved.cells)]
    cells, _ = benchmath.summarise(workloads_run, configs, runs)
    assert cells
    over = [f"{c.workload} / {c.config}: {c.efficiency:.0%}" for c in cells if (c.efficiency or 0) > 1.0]
    assert over == []


def test_llama_cpp_runs_its_draft_simple_over_a_grid_with_its_defaults():
    from localspec.bench import peer
    from localspec.bench.clients import CLIENT_MODES
    from localspec.bench.session_run import DEFAULT_SESSION_ROWS, SESSION_ROWS
    from localspec.cli import bench as cli_bench
    from localspec.cli import bench_options

    ours = [DraftSettings("model", 4, p_min=0.75), DraftSettings("ngram", 4), DraftSettings("suffix", 8)]
    got = [c.label for c in peer.peer_configs(ours, [2, 4], [0.5])]
    assert got == ["model k=2 p_min=0.5", "model k=3 p_min=0", "model k=4 p_min=0.5", "ngram k=4"]
    assert len(peer.peer_configs(ours)) == 7 * 3 + 1  # n-max 2..8 x p-min 0, 0.5, 0.75 (3/0 among them)
    assert peer.peer_configs([DraftSettings("model", 4, adaptive=True)]) == []
    # the command's defaults and names are the library's (kept apart so that --help imports neither)
    assert tune.parse_int_range(cli_bench._PEER_N_MAX) == list(peer.PEER_N_MAX)
    assert tune.parse_p_min_list(cli_bench._PEER_P_MIN) == list(peer.PEER_P_MIN)
    assert cli_bench._SESSION_ROWS == tuple(SESSION_ROWS)
    assert cli_bench._DEFAULT_SESSION_ROWS == DEFAULT_SESSION_ROWS
    assert bench_options.SESSION_PEER_MODES == peer.SESSION_MODES
    assert bench_options.CLIENT_PEER_MODES == CLIENT_MODES


@pytest.mark.parametrize(
    "args, says",
    [
        (["--peer-n-max", "2-4"], "--peer-n-max needs --peer"),
        (["--session-rows", "ngram-4"], "--session-rows needs --sessions"),
        (["--sessions", "agent", "--peer-modes", "none"], "--peer-modes needs --peer with --sessions or"),
        (["--sessions", "agent", "--peer", "--peer-modes", "draft-mtp"], "draft-mtp does not run with"),
        (
            ["--sessions", "agent", "--peer", "--peer-p-min", "0"],
            "--peer-p-min does not apply with --sessions",
        ),
        (["--from-json", __file__, "--limit", "2"], "--from-json runs nothing: --limit does not apply"),
    ],
)
def test_bench_options_that_need_another_are_refused_as_parsed(no_model_loads, tmp_path, args, says):
    from click.testing import CliRunner

    from localspec.cli import main

    res = CliRunner().invoke(main, ["bench", "-q", "--out", str(tmp_path / "out"), *args])
    assert res.exit_code == 2, res.output
    assert says in " ".join(res.output.split()), res.output


def test_a_combinations_lookup_time_is_told_apart_from_its_models():
    """With the runs' per-drafter seconds, a draft token's cost ``c`` is the model's own (not the lookups'),
    and the cell says each part's share of the time."""
    t = 0.1
    base = [("a", _stats(10.0, rounds=100, verify_seconds=100 * t, total_seconds=10.0))]
    lookups = 160 * 0.1 * t  # the suffix cache's seconds, on top of the model's 160 * 0.4 * t
    parts = {"model": {"seconds": 160 * 0.4 * t}, "suffix": {"seconds": lookups}}
    spec = [("a", _drafting_stats(12.0, t, by_drafter=parts))]
    spec[0][1]["draft_seconds"] += lookups
    cell = benchmath.summarise_cell("w", DraftSettings("model+suffix", 4, p_min=0.0), base, spec)
    assert cell.c == pytest.approx(0.4)  # the lookups' time left out
    total = spec[0][1]["total_seconds"]
    assert cell.draft_share_by_drafter == pytest.approx({"model": 6.4 / total, "suffix": 1.6 / total})
    older = [
        ("a", _drafting_stats(12.0, t))
    ]  # a run written before by_drafter: all draft time is the model's
    assert benchmath.summarise_cell(
        "w", DraftSettings("model", 4, p_min=0.0), base, older
    ).c == pytest.approx(0.4)


def test_the_reference_lists_the_options_each_mode_refuses():
    """docs/reference/bench.md names what `--sessions` and `--tune` refuse: the same options the code refuses
    (`--wide-target` with `--sessions` was once accepted and silently left out)."""
    from localspec.cli.bench import bench
    from localspec.cli.bench_options import NOT_READ

    text = (Path(__file__).resolve().parent.parent / "docs" / "reference" / "bench.md").read_text()
    flags = {p.name: max(p.opts, key=len) for p in bench.params}
    for mode, start in (
        ("sessions", "The options a session run does not read"),
        ("tune", "an option the tuner"),
        ("clients", "The options the clients bench does not read"),
        ("rpc_rtt", "The options the RPC bench does not read"),
    ):
        said = text[text.index(start) :].split(")", 1)[0]
        named = set(re.findall(r"`(--[\w-]+)`", said))
        assert named == {flags[name] for name in NOT_READ[mode]}, (mode, named)
