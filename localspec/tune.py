"""The tuner: sweep strategy x draft length x p_min per workload, pick the fastest (or honestly none)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from localspec.bench import BASELINE, STRATEGIES, Config, Runner, Workload
from localspec.benchmath import summarise
from localspec.errors import BenchError


def tune_configs(
    strategies: Sequence[str], n_max_values: Sequence[int], p_min_values: Sequence[float]
) -> list[Config]:
    """The sweep grid; n-gram lookup has no probabilities, so it ignores p_min."""
    out: list[Config] = []
    for s in strategies:
        if s == "none":
            continue
        if s not in STRATEGIES:
            raise BenchError(f"unknown strategy {s!r}", hint=f"choose from: {', '.join(STRATEGIES)}")
        for k in n_max_values:
            if s == "ngram":
                out.append(Config(s, k, None))
            else:
                out.extend(Config(s, k, p) for p in p_min_values)
    return out


def with_baselines(configs: list[Config], every: int = 4) -> list[Config]:
    """Insert the baseline before every ``every`` configs and at the end, so drift reaches both sides."""
    out: list[Config] = []
    for i, c in enumerate(configs):
        if i % every == 0:
            out.append(BASELINE)
        out.append(c)
    out.append(BASELINE)
    return out


def _interleave_raw(
    runner: Runner, w: Workload, order: list[Config], max_tokens: int, progress
) -> list[dict]:
    records = []
    for prompt in w.prompts:
        for cfg in order:
            stats = runner(prompt, cfg, max_tokens)
            records.append(
                {"workload": w.name, "prompt_id": prompt.id, "config": cfg.label, "repeat": 0, "stats": stats}
            )
            if progress:
                progress(
                    f"tune {w.name} {prompt.id} {cfg.label}: {stats.get('tokens_per_second') or 0:.2f} tok/s"
                )
    return records


def tune(
    runner: Runner,
    workloads: list[Workload],
    configs: list[Config],
    *,
    max_tokens: int,
    margin: float = 0.02,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure every config per workload (baselines interleaved) and pick the fastest.

    The winner must beat the target alone by ``margin`` (default 2%); otherwise the honest answer is
    ``none``: run the target alone for that workload.
    """
    order = with_baselines(configs)
    result: dict[str, Any] = {"configs": [c.label for c in configs], "margin": margin, "workloads": {}}
    for w in workloads:
        records = _interleave_raw(runner, w, order, max_tokens, progress)
        cells, _ = summarise([w], configs, records)
        ranked = sorted(cells, key=lambda c: -(c.speedup if not math.isnan(c.speedup) else 0))
        best = ranked[0] if ranked else None
        if best is not None and best.speedup >= 1.0 + margin:
            winner = {
                "strategy": best.strategy,
                "n_max": best.n_max,
                "p_min": best.p_min,
                "speedup": best.speedup,
                "config": best.config,
            }
            note = f"{best.config} at {best.speedup:.2f}x"
        else:
            winner = {"strategy": "none", "n_max": None, "p_min": None, "speedup": 1.0, "config": "none"}
            note = "nothing beat the target alone" + (
                f" (best: {best.config} at {best.speedup:.2f}x)" if best else ""
            )
        result["workloads"][w.name] = {
            "winner": winner,
            "note": note,
            "cells": [
                {
                    "config": c.config,
                    "strategy": c.strategy,
                    "n_max": c.n_max,
                    "p_min": c.p_min,
                    "speedup": c.speedup,
                    "acceptance_rate": c.acceptance_rate,
                    "speculative_tps": c.speculative_tps,
                    "baseline_tps": c.baseline_tps,
                }
                for c in ranked
            ],
        }
    return result


def overall_winner(tuning: dict[str, Any]) -> dict[str, Any]:
    """The config with the best geometric-mean speedup over all tuned workloads (``none`` if none beats 1)."""
    scores: dict[str, list[float]] = {}
    for wres in tuning["workloads"].values():
        for c in wres["cells"]:
            if c["speedup"] and not math.isnan(c["speedup"]):
                scores.setdefault(c["config"], []).append(c["speedup"])
    n = len(tuning["workloads"])
    cells = {c["config"]: c for w in tuning["workloads"].values() for c in w["cells"]}
    best_label, best = "none", 1.0 + tuning.get("margin", 0.0)
    for label, vals in scores.items():
        if len(vals) == n:
            g = math.exp(sum(math.log(v) for v in vals) / n)
            if g >= best:
                best_label, best = label, g
    if best_label == "none":
        return {"config": "none", "strategy": "none", "n_max": None, "p_min": None, "speedup": 1.0}
    c = cells[best_label]
    return {
        "config": best_label,
        "strategy": c["strategy"],
        "n_max": c["n_max"],
        "p_min": c["p_min"],
        "speedup": best,
    }
