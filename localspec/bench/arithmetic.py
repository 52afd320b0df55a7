"""Benchmark arithmetic: medians, interleaving order, the Leviathan et al. ceiling, efficiency, loss factors.

Works on plain stats dicts (``GenerationStats.as_dict()``); knows nothing about models or files.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from localspec.bench.workloads import Workload
from localspec.settings import BASELINE, DraftSettings

BASELINE_LABEL = BASELINE.label


def median(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return float("nan")
    return float(statistics.median(vals))


def interleaved_order(
    n_prompts: int, n_configs: int, repeats: int = 1, warmup: bool = False, *, sequential: bool = False
) -> list[tuple[int, int, int]]:
    """(prompt index, config index, repeat) in run order; warm-up runs have repeat ``-1``.

    Per prompt and repeat every config runs once, in the given order (baseline first), so a slow drift of
    the machine hits baseline and speculative runs alike. ``sequential`` (a workload whose prompts are one
    session): per repeat, each config runs every prompt in order before the next config starts.
    """
    order = [(0, c, -1) for c in range(n_configs)] if warmup and n_prompts else []
    if sequential:
        for r in range(repeats):
            for c in range(n_configs):
                order.extend((p, c, r) for p in range(n_prompts))
        return order
    for p in range(n_prompts):
        for r in range(repeats):
            order.extend((p, c, r) for c in range(n_configs))
    return order


def expected_tokens_per_round(a: float, k: float) -> float:
    """Leviathan et al. 2023, eq. 1: tokens a round yields with acceptance ``a`` and draft length ``k``."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1.0)) / (1.0 - a)


def ceiling_speedup(a: float, k: float, c: float, v: float) -> float:
    """Speedup speculative decoding can reach: E(a, k) / (k * c + V(k+1)).

    ``c`` = draft per-token cost / target per-token cost (0 for n-gram lookup); ``v`` = cost of verifying
    k+1 tokens in one target pass relative to one single-token target pass.
    """
    return expected_tokens_per_round(a, k) / (k * c + v)


def best_draft_length(
    a: float, k_max: int, c: float, slope: float, rollback: float = 0.0
) -> tuple[int, float]:
    """The draft length in 1..k_max with the highest ceiling (V(k+1) = 1 + slope k, plus ``rollback``: what
    taking drafts back out of a recurrent target cost per drafting round, in target tokens), and that
    ceiling."""

    def ceiling(k: int) -> float:
        return ceiling_speedup(a, k, c, 1.0 + slope * k + rollback)

    best = max(range(1, max(1, k_max) + 1), key=ceiling)
    return best, ceiling(best)


def fit_acceptance(mean_accepted: float, k: float) -> float:
    """Per-token acceptance a of the i.i.d. model that yields ``mean_accepted`` of ``k`` drafts per round.

    The raw rate accepted/drafted counts the drafts after the first rejection as rejected too, which
    understates a; Leviathan's E(a, k) needs the per-token probability. Solves a (1 - a^k) / (1 - a) = m.
    """
    if k <= 0 or mean_accepted <= 0:
        return 0.0
    if mean_accepted >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens_per_round(mid, k) - 1.0 < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


#: The steepest verify-cost slope a machine can have: V(b) = 1 + s (b - 1) <= b one-token passes, with
#: 20% for timing noise (``report.NOISE_MARGIN``). A fit above it (282 seen beside a busy process) gives
#: no ceiling and a warning.
MAX_PHYSICAL_SLOPE = 1.2


def verify_slope(points: Iterable[tuple[float, float, float]]) -> float:
    """Least-squares slope s of V(b) = 1 + s (b - 1) through (batch size b, V(b), weight) points."""
    num = den = 0.0
    for b, v, w in points:
        num += w * (b - 1.0) * (v - 1.0)
        den += w * (b - 1.0) ** 2
    return num / den if den > 1e-9 else float("nan")


def _sum(runs: list[dict], key: str) -> float:
    return float(sum(r.get(key) or 0 for r in runs))


@dataclass
class CellResult:
    """One workload x one config: medians over prompts, the ceiling, efficiency and where the rest went."""

    workload: str
    config: str
    strategy: str
    n_max: int | None
    p_min: float | None
    prompts: int
    baseline_tps: float
    speculative_tps: float
    speedup: float
    speedup_per_prompt: list[float]
    acceptance_rate: float
    mean_accepted_length: float
    tokens_per_round: float
    draft_length: float
    drafting_rounds: int
    a: float
    generated_tokens: int
    draft_share: float
    verify_share: float
    other_share: float
    identical_output: float | None
    prompt_seconds_baseline: float
    prompt_seconds_speculative: float
    target_token_seconds: float = float("nan")
    base_seconds_per_token: float = float("nan")
    spec_seconds_per_token: float = float("nan")
    evals_per_round: float = 0.0
    c: float = float("nan")
    # a recurrent target: state copies per drafting round (target tokens) and tokens evaluated again after
    # a restore per drafting round (their rows are in the verify passes); 0 for a transformer
    rollback_copies: float = 0.0
    replayed_per_round: float = 0.0
    v_at_batch: float = float("nan")
    batch: float = float("nan")
    v_k1: float | None = None
    expected_tokens: float | None = None
    ceiling: float | None = None
    efficiency: float | None = None
    adaptive: bool = False
    best_k: int | None = None  # the draft length (1..n_max) with the highest ceiling at this acceptance
    best_ceiling: float | None = None
    # the adaptive controller's own prediction for its drafting, median over runs (None: not adaptive)
    predicted_speedup: float | None = None
    losses: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def _per_prompt_tps(runs: Sequence[tuple[str, dict]]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for pid, s in runs:
        by.setdefault(pid, []).append(s.get("tokens_per_second") or 0.0)
    return {pid: median(v) for pid, v in by.items()}


def summarise_cell(
    workload: str, config: DraftSettings, base_runs: list[tuple[str, dict]], spec_runs: list[tuple[str, dict]]
) -> CellResult:
    """Medians and pooled rates for one config; ceiling fields are filled by :func:`add_ceilings`."""
    base_tps, spec_tps = _per_prompt_tps(base_runs), _per_prompt_tps(spec_runs)
    base_text = {pid: s.get("text") for pid, s in base_runs}
    same = [base_text[pid] == s.get("text") for pid, s in spec_runs if base_text.get(pid) is not None]
    ratios = [spec_tps[p] / base_tps[p] for p in spec_tps if base_tps.get(p)]
    bs, ss = [s for _, s in base_runs], [s for _, s in spec_runs]
    drafted, accepted, rounds = _sum(ss, "drafted"), _sum(ss, "accepted"), _sum(ss, "rounds")
    drafting = (sum((s.get("drafted_by_position") or [0])[0] for s in ss) or rounds) if drafted else 0
    gen, total = _sum(ss, "generated_tokens"), _sum(ss, "total_seconds")
    draft_s, verify_s = _sum(ss, "draft_seconds"), _sum(ss, "verify_seconds")
    base_gen, base_rounds = _sum(bs, "generated_tokens"), _sum(bs, "rounds")
    base_verify, base_total = _sum(bs, "verify_seconds"), _sum(bs, "total_seconds")
    t_dec = (
        base_verify / base_rounds
        if base_rounds and base_verify
        else (base_total / base_gen if base_gen else 0)
    )
    cell = CellResult(
        workload=workload,
        config=config.label,
        strategy=config.strategy,
        n_max=config.n_max,
        p_min=config.p_min if config.uses_model else None,  # n-gram lookup has no p_min
        prompts=len(spec_tps),
        baseline_tps=median(base_tps.values()),
        speculative_tps=median(spec_tps.values()),
        speedup=median(ratios),
        speedup_per_prompt=[round(r, 4) for r in ratios],
        acceptance_rate=accepted / drafted if drafted else 0.0,
        mean_accepted_length=accepted / rounds if rounds else 0.0,
        tokens_per_round=gen / rounds if rounds else 0.0,
        draft_length=drafted / rounds if rounds else 0.0,
        drafting_rounds=int(drafting),
        a=fit_acceptance(accepted / drafting, drafted / drafting) if drafting else 0.0,
        generated_tokens=int(gen),
        draft_share=draft_s / total if total else 0.0,
        verify_share=verify_s / total if total else 0.0,
        other_share=max(0.0, 1.0 - (draft_s + verify_s) / total) if total else 0.0,
        identical_output=sum(same) / len(same) if same else None,
        prompt_seconds_baseline=median(s.get("prompt_seconds") or 0 for s in bs),
        prompt_seconds_speculative=median(s.get("prompt_seconds") or 0 for s in ss),
        target_token_seconds=t_dec,
        adaptive=config.adaptive,
    )
    predicted = [s["predicted_speedup"] for s in ss if s.get("predicted_speedup")]
    cell.predicted_speedup = median(predicted) if predicted else None
    if rounds and t_dec:
        evals = _sum(ss, "draft_evals")
        uses_model = config.uses_model and evals > 0
        cell.c = (draft_s / evals) / t_dec if uses_model else 0.0
        cell.batch = _sum(ss, "verify_tokens") / rounds
        cell.v_at_batch = (verify_s / rounds) / t_dec
        cell.evals_per_round = evals / rounds if uses_model else 0.0
        if drafting:
            cell.rollback_copies = (_sum(ss, "rollback_seconds") / drafting) / t_dec
            cell.replayed_per_round = _sum(ss, "replayed_tokens") / drafting
        cell.spec_seconds_per_token = total / gen if gen else float("nan")
        cell.base_seconds_per_token = base_total / base_gen if base_gen else float("nan")
    return cell


def add_ceilings(cells: list[CellResult], slope: float | None = None) -> float:
    """Fill ceiling, efficiency and the loss factors of every speculative cell; returns the verify slope used.

    V(b) = 1 + s (b - 1) is fitted once over all cells (each cell's measured cost of its mean verify batch),
    then V(k+1) for the configured draft length k. An adaptive cell picks its draft length per round (none
    included), so its ceiling is the best over 1..k and never below 1x. The loss factors multiply to the
    efficiency: ``draft_length`` (rounds yield fewer tokens or cost other than the ideal k-token round:
    p_min stops, n-gram misses, rejected tails), ``loop_overhead`` (time outside draft and verify passes:
    sampling, Python; a lookup counts as drafting), ``baseline_overhead`` (the same kind of time in the
    baseline, which counts in our favour) and ``residual`` (median-of-prompts vs pooled totals, run-to-run
    noise).
    """
    spec = [c for c in cells if c.strategy != BASELINE.strategy and not math.isnan(c.v_at_batch)]
    if slope is None:
        slope = verify_slope((c.batch, c.v_at_batch, c.generated_tokens) for c in spec)
    for c in spec:
        a, k = c.a, float(c.n_max or round(c.draft_length) or 1)
        if math.isnan(slope) or not 0 < slope <= MAX_PHYSICAL_SLOPE or not c.drafting_rounds:
            # no verify-cost fit, or a non-physical one (wider passes never cost less, and a b-token pass
            # never more than b one-token passes: past that the timings were taken on a busy machine), or
            # nothing was drafted: no ceiling to speak of
            continue
        c.v_k1 = 1.0 + slope * k
        rollback = c.rollback_copies + slope * c.replayed_per_round  # 0 for a transformer target
        c.expected_tokens = expected_tokens_per_round(a, k)
        c.ceiling = ceiling_speedup(a, k, c.c, c.v_k1 + rollback)
        c.best_k, c.best_ceiling = best_draft_length(a, int(k), c.c, slope, rollback)
        if c.adaptive:
            c.ceiling = max(1.0, c.best_ceiling)
        if not c.ceiling or math.isnan(c.speedup):
            continue
        c.efficiency = c.speedup / c.ceiling
        ideal_round = c.evals_per_round * c.c + c.v_at_batch
        s_len = c.tokens_per_round / ideal_round if ideal_round else float("nan")
        s_ov = c.target_token_seconds / c.spec_seconds_per_token
        base_gain = c.base_seconds_per_token / c.target_token_seconds
        c.losses = {
            "draft_length": s_len / c.ceiling,
            "loop_overhead": s_ov / s_len,
            "baseline_overhead": base_gain,
            "residual": c.speedup / (s_ov * base_gain),
        }
    return slope


def summarise(
    workloads: list[Workload],
    configs: list[DraftSettings],
    records: list[dict],
    slope: float | None = None,
    engine: str = "localspec",
) -> tuple[list[CellResult], float]:
    """Group run records (``workload``, ``prompt_id``, ``config``, ``repeat``, ``stats``) into cells."""
    cells = []
    for w in workloads:
        rows = [
            r
            for r in records
            if r["workload"] == w.name and r["repeat"] >= 0 and r.get("engine", "localspec") == engine
        ]
        base = [(r["prompt_id"], r["stats"]) for r in rows if r["config"] == BASELINE_LABEL]
        for cfg in configs:
            if not cfg.is_speculative:
                continue
            spec = [(r["prompt_id"], r["stats"]) for r in rows if r["config"] == cfg.label]
            if spec:
                cells.append(summarise_cell(w.name, cfg, base, spec))
    return cells, add_ceilings(cells, slope)
