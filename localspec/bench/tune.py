"""The tuner: sweep strategy x draft length x p_min per workload, pick the fastest (or honestly none)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from localspec import constants
from localspec.bench.arithmetic import summarise
from localspec.bench.report import BenchReport, machine_info
from localspec.bench.single import (
    check_prompts_fit,
    default_strategies,
    engine_runner,
    open_pipeline,
    pair_info,
    run_interleaved,
)
from localspec.bench.tuning import TARGET_ALONE, Tuning, Winner, WorkloadTuning, ranked
from localspec.bench.workloads import Runner, Workload, load_workloads
from localspec.errors import BenchError
from localspec.settings import (
    BASELINE,
    MAX_TUNE_SWEEP,
    MODEL_DRAFTER_STRATEGIES,
    MTP_STRATEGIES,
    N_MAX_RANGE,
    P_MIN_RANGE,
    PAIR_STRATEGIES,
    SPECULATIVE_STRATEGIES,
    STRATEGIES,
    DraftSettings,
)

#: How many configs run between two baselines in a sweep (see ``bench.plan_configs``).
BASELINE_EVERY = 4


def tune_configs(
    strategies: Sequence[str],
    n_max_values: Sequence[int],
    p_min_values: Sequence[float],
    adaptive: bool = False,
) -> list[DraftSettings]:
    """The sweep grid; n-gram lookup has no probabilities, so it ignores p_min.

    ``adaptive`` adds each strategy with the adaptive draft length, up to the longest draft swept.
    """
    out: list[DraftSettings] = []
    for s in strategies:
        if s not in STRATEGIES:
            raise BenchError(f"unknown strategy {s!r}", hint=f"choose from: {', '.join(STRATEGIES)}")
        if s not in SPECULATIVE_STRATEGIES:
            continue
        base = DraftSettings(strategy=s)
        ps = p_min_values if base.uses_model or base.uses_mtp else [base.p_min]
        for k in n_max_values:
            out.extend(base.with_overrides(n_max=k, p_min=p) for p in ps)
        if adaptive:
            out.extend(base.with_overrides(n_max=max(n_max_values), p_min=p, adaptive=True) for p in ps)
    return out


def tune(
    runner: Runner,
    workloads: list[Workload],
    configs: list[DraftSettings],
    *,
    max_tokens: int,
    margin: float = 0.02,
    progress: Callable[[str], None] | None = None,
) -> Tuning:
    """Measure every config per workload (baselines interleaved) and pick the fastest.

    The winner must beat the target alone by ``margin`` (default 2%); otherwise the honest answer is
    ``none``: run the target alone for that workload.
    """
    result = Tuning(configs=[c.label for c in configs], margin=margin, workloads={})
    for w in workloads:
        records = run_interleaved(
            runner,
            [w],
            configs,
            max_tokens=max_tokens,
            warmup=False,
            baseline_every=BASELINE_EVERY,
            progress=progress,
        )
        cells = ranked(summarise([w], configs, records)[0])
        best = cells[0] if cells else None
        if best is not None and best.speedup >= 1.0 + margin:
            winner, note = Winner.of(best), f"{best.config} at {best.speedup:.2f}x"
        else:
            winner = TARGET_ALONE
            note = "nothing beat the target alone" + (
                f" (best: {best.config} at {best.speedup:.2f}x)" if best else ""
            )
        result.workloads[w.name] = WorkloadTuning(cells, winner, note)
    result.overall = overall_winner(result)
    return result


def overall_winner(tuning: Tuning) -> Winner:
    """The config with the best geometric-mean speedup over all tuned workloads (``none`` if none beats 1)."""
    scores: dict[str, list[float]] = {}
    for wres in tuning.workloads.values():
        for c in wres.cells:
            if c.speedup and not math.isnan(c.speedup):
                scores.setdefault(c.config, []).append(c.speedup)
    n = len(tuning.workloads)
    cells = {c.config: c for w in tuning.workloads.values() for c in w.cells}
    best_label, best = BASELINE.label, 1.0 + tuning.margin
    for label, vals in scores.items():
        if len(vals) == n:
            g = math.exp(sum(math.log(v) for v in vals) / n)
            if g >= best:
                best_label, best = label, g
    if best_label == BASELINE.label:
        return TARGET_ALONE
    return Winner.of(cells[best_label], speedup=best)


#: One part of a list of draft lengths: ``"4"`` or ``"2-6"`` (ASCII digits only: no signs, no ``1_000``).
_LENGTHS_PART = re.compile(r"(\d+)\s*(?:-\s*(\d+))?", re.ASCII)
#: One p_min value as people write it: ``0.75``, ``.5``, ``1``, ``1e-1`` (a sign only to be refused by range).
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", re.ASCII)


def _lengths_form() -> str:
    lo, hi = N_MAX_RANGE
    return (
        f'a range and/or a comma-separated list of whole numbers, each {lo}<=x<={hi}: e.g. "1-8" or "2,4,6"'
    )


def _p_min_form() -> str:
    lo, hi = P_MIN_RANGE
    return f'a comma-separated list of numbers, each {lo}<=x<={hi}: e.g. "0.5,0.75,0.9"'


def _length(digits: str) -> int:
    # a number of a dozen digits is out of range whatever it is; int() refuses past 4300 digits anyway
    return int(digits) if len(digits) <= 9 else N_MAX_RANGE[1] + 1


def parse_int_range(text: str) -> list[int]:
    """``"1-8"``, ``"2,4,6"`` or both (``"1-3,6"``) -> the draft lengths to sweep, in order, each once.

    Every length is held to ``settings.N_MAX_RANGE``, the bounds of ``n_max`` (``run --n-max``), and a range
    is checked before it is built (``"1-1000000000000"`` is refused, not expanded). Anything else raises
    :class:`BenchError` naming the part at fault, with the accepted form as the hint.
    """
    lo_ok, hi_ok = N_MAX_RANGE
    out: dict[int, None] = {}  # ordered and without repeats: "1-8,4" sweeps 4 once
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = _LENGTHS_PART.fullmatch(part)
        if m is None:
            raise BenchError(
                f"{part!r} is not a draft length or a range of them", hint=f"use {_lengths_form()}"
            )
        lo = _length(m[1])
        hi = lo if m[2] is None else _length(m[2])
        if not (lo_ok <= lo <= hi_ok and lo_ok <= hi <= hi_ok):
            raise BenchError(
                f"{part!r} is not in the range {lo_ok}<=x<={hi_ok} (the bounds of n_max)",
                hint='use lengths within it, e.g. "1-8" or "2,4,6"',
            )
        if lo > hi:
            raise BenchError(f"{part!r} runs backwards", hint=f'write the shorter length first: "{hi}-{lo}"')
        out.update(dict.fromkeys(range(lo, hi + 1)))
    if not out:
        raise BenchError(f"no draft lengths in {text!r}", hint=f"use {_lengths_form()}")
    return list(out)


def parse_p_min_list(text: str) -> list[float]:
    """``"0.5,0.75,0.9"`` -> the p_min values to sweep, in the order given, each once.

    Every value is held to ``settings.P_MIN_RANGE``, the bounds of ``p_min`` (``run --p-min``); ``nan`` and
    ``inf`` are not numbers here. Two values that reports print the same (``0.75`` and ``0.7500001``: config
    labels show six digits) would be one setting measured twice under one name, so they are refused.
    """
    lo_ok, hi_ok = P_MIN_RANGE
    out: dict[str, tuple[float, str]] = {}  # by the label's spelling of the value (DraftSettings.label)
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if _NUMBER.fullmatch(part) is None:
            finite = part.lower().lstrip("+-") not in ("nan", "inf", "infinity")
            what = "a number" if finite else "a finite number"
            raise BenchError(f"{part!r} is not {what}", hint=f"use {_p_min_form()}")
        p = float(part) + 0.0  # + 0.0: "-0" is 0.0, not a second spelling of it
        if not lo_ok <= p <= hi_ok:  # float() of a long exponent is inf: out of range too
            raise BenchError(
                f"{part!r} is not in the range {lo_ok}<=x<={hi_ok} (the bounds of p_min)",
                hint='use values within it, e.g. "0.5,0.75,0.9"',
            )
        key = f"{p:g}"
        if key in out and out[key][0] != p:
            raise BenchError(
                f"{out[key][1]!r} and {part!r} are one setting in the reports (p_min={key})",
                hint="give values that differ within six significant digits",
            )
        out.setdefault(key, (p, part))
    if not out:
        raise BenchError(f"no p_min values in {text!r}", hint=f"use {_p_min_form()}")
    return [p for p, _ in out.values()]


def sweep_size(
    strategies: Sequence[str],
    n_max_values: Sequence[int],
    p_min_values: Sequence[float],
    adaptive: bool = False,
) -> int:
    """How many settings :func:`tune_configs` makes of these, counted without building them."""
    size = 0
    for s in strategies:
        if s not in STRATEGIES:
            raise BenchError(f"unknown strategy {s!r}", hint=f"choose from: {', '.join(STRATEGIES)}")
        if s in SPECULATIVE_STRATEGIES:
            ps = len(p_min_values) if s in MODEL_DRAFTER_STRATEGIES else 1
            size += ps * (len(n_max_values) + (1 if adaptive else 0))
    return size


def check_sweep(
    strategies: Sequence[str] | None,
    n_max_values: Sequence[int],
    p_min_values: Sequence[float],
    adaptive: bool = False,
) -> tuple[list[int], list[float]]:
    """Refuse a sweep before anything loads: no values, values out of bounds, or more than
    :data:`~localspec.settings.MAX_TUNE_SWEEP` settings per prompt. ``strategies=None`` counts every
    drafting strategy (what a pair with a draft model sweeps). Returns the draft lengths and p_min values
    to sweep, each once, in the order given."""
    if any(isinstance(k, bool) or not isinstance(k, int) for k in n_max_values):
        raise BenchError(
            f"draft lengths must be whole numbers, got {list(n_max_values)!r}", hint="e.g. [1, 2, 4]"
        )
    if any(isinstance(p, bool) or not isinstance(p, (int, float)) for p in p_min_values):
        raise BenchError(f"p_min values must be numbers, got {list(p_min_values)!r}", hint="e.g. [0.5, 0.75]")
    # the bounds, the repeats and the empty list: the parsers' own checks, worded as for the command line
    lengths = parse_int_range(",".join(str(k) for k in n_max_values))
    p_values = parse_p_min_list(",".join(repr(float(p)) for p in p_min_values))
    names = list(PAIR_STRATEGIES) if strategies is None else list(strategies)
    size = sweep_size(names, lengths, p_values, adaptive)
    if size > MAX_TUNE_SWEEP:
        raise BenchError(
            f"the sweep is {size} settings per prompt ({len(names)} "
            f"strateg{'y' if len(names) == 1 else 'ies'}, {len(lengths)} draft "
            f"lengths{' and adaptive' if adaptive else ''}, {len(p_values)} p_min values for those with a "
            f"draft model), more than {MAX_TUNE_SWEEP}",
            hint="sweep fewer draft lengths or p_min values, or name fewer strategies "
            "(localspec bench: --tune-n-max, --tune-p-min, --strategy)",
        )
    return lengths, p_values


def tune_benchmark(
    *,
    target: str | None = None,
    draft: str | None = None,
    preset: str | None = None,
    workloads: Sequence[str] | None = None,
    prompts_file: str | None = None,
    limit: int | None = 2,
    max_tokens: int = 64,
    temperature: float = 0.0,
    threads: int | None = None,
    n_ctx: int | None = None,
    strategies: Sequence[str] | None = None,
    n_max_values: Sequence[int] = tuple(range(1, 9)),
    p_min_values: Sequence[float] = (0.5, 0.75, 0.9),
    adaptive: bool = False,
    margin: float = 0.02,
    progress: Callable[[str], None] | None = None,
) -> BenchReport:
    """Load the pair, sweep the grid on every workload and return a report with ``tuning``.

    The grid is checked first (:func:`check_sweep`): a sweep that cannot run fails before the pair loads.
    """
    n_max_values, p_min_values = check_sweep(strategies or None, n_max_values, p_min_values, adaptive)
    wl = load_workloads(workloads, prompts_file, limit)
    threads = threads or constants.default_threads()
    mtp = any(s in MTP_STRATEGIES for s in strategies or ())
    pipe = open_pipeline(target, draft, preset, threads=threads, n_ctx=n_ctx, strategy="mtp" if mtp else None)
    try:
        if not strategies:
            strategies = list(PAIR_STRATEGIES) if pipe.info.draft_path else default_strategies(pipe)
        strategies = list(strategies)
        configs = tune_configs(strategies, n_max_values, p_min_values, adaptive)
        check_prompts_fit(pipe, wl, max_tokens)
        runner = engine_runner(pipe, temperature=temperature)
        runner(wl[0].prompts[0], BASELINE, min(8, max_tokens))  # warm-up, not counted
        tuning = tune(runner, wl, configs, max_tokens=max_tokens, margin=margin, progress=progress)
        cells = [c for t in tuning.workloads.values() for c in t.cells]
        settings = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "repeats": 1,
            "threads": threads,
            "strategies": strategies,
            "n_max": list(n_max_values),
            "p_min": list(p_min_values),
            "adaptive": adaptive,
            "workloads": [w.name for w in wl],
            "prompts": {w.name: len(w.prompts) for w in wl},
        }
        return BenchReport(
            machine=machine_info(threads),
            settings=settings,
            pair=pair_info(pipe),
            cells=cells,
            memory=pipe.memory.as_dict(),
            tuning=tuning,
        )
    finally:
        pipe.close()


def _draft_table(winner: Winner) -> dict[str, Any]:
    out: dict[str, Any] = {"strategy": winner.strategy}
    if winner.n_max:
        out["n_max"] = int(winner.n_max)
    if winner.p_min is not None:
        out["p_min"] = float(winner.p_min)
    out["adaptive"] = winner.adaptive
    return out


#: How the description of a preset :func:`save_winners` writes begins (``export`` finds a tuned one by it).
TUNED = "tuned by localspec bench"


def save_winners(report: BenchReport, name: str, *, preset: str | None = None) -> list[str]:
    """Write the overall winner as user preset ``name`` and each workload's winner as ``name-<workload>``.

    Built on ``preset`` when the bench ran one (its download references are kept), else on local paths.
    Returns the paths written; a user preset of the same name is replaced, and ``report.tuning.replaced``
    lists the paths that held one before.
    """
    from localspec.hub.presets import get_preset, save_user_preset, user_preset_path

    tuning, pair = report.tuning, report.pair
    if tuning is None:
        raise BenchError("no tuning to save", hint="run localspec bench --tune")
    winners = [(name, tuning.overall, "")] + [
        (f"{name}-{w}", t.winner, f" on the {w} prompts") for w, t in tuning.workloads.items()
    ]
    paths = []
    tuning.replaced = [
        str(user_preset_path(pname)) for pname, _, _ in winners if user_preset_path(pname).exists()
    ]
    for pname, win, where in winners:
        draft = _draft_table(win)
        desc = f"{TUNED}{where}: {win.config} ({win.speedup:.2f}x)"
        if preset:
            base = get_preset(preset)
            settings = replace(base.draft, **draft)
            p = save_user_preset(replace(base, name=pname, description=desc, draft=settings, source="user"))
        else:
            table: dict[str, Any] = {
                "name": pname,
                "description": desc,
                "target": {"path": pair["target"]},
                "n_ctx": pair["n_ctx"],
                "draft": draft,
            }
            if pair.get("draft"):
                table["draft_model"] = {"path": pair["draft"]}
            p = save_user_preset(table)
        paths.append(str(p))
    return paths
