"""Benchmark arithmetic: medians, interleaving order, cells, their ceiling, efficiency and loss factors.

Works on plain stats dicts (``GenerationStats.as_dict()``); knows nothing about models or files. Every
expected-tokens and speedup figure comes from the one model of speed, :mod:`localspec.decoding.speed`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from localspec.bench.workloads import LOCALSPEC, RunRecord, Workload
from localspec.decoding import speed
from localspec.decoding.draft import MODEL_SOURCES
from localspec.settings import BASELINE, DRAFT_MODEL, DraftSettings, Strategy, parse_strategy

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


#: The steepest verify-cost slope a machine can have: a pass of b rows costs at most b one-row passes, with
#: 20% for timing noise (``report.NOISE_MARGIN``). A fit above it (282 seen beside a busy process) gives
#: no ceiling and a warning; so does a two-row pass fitted above 2 x 1.2 one-row passes.
MAX_PHYSICAL_SLOPE = 1.2


def _sum(runs: list[dict], key: str) -> float:
    return float(sum(r.get(key) or 0 for r in runs))


def _sum_lists(lists: Iterable[list[int] | None]) -> list[int]:
    out: list[int] = []
    for xs in lists:
        for i, n in enumerate(xs or []):
            if i == len(out):
                out.append(0)
            out[i] += n
    return out


@dataclass
class CellResult:
    """One workload x one config: medians over prompts, the ceiling, efficiency and where the rest went."""

    workload: str
    config: str
    strategy: str  # its name, as the report's JSON holds it (``kind``: parsed)
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
    a: float  # the i.i.d. acceptance that yields the measured accepted drafts per drafting round
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
    # P(the first i + 1 drafts all accepted) per position, over drafting rounds (a draft cut short counts as
    # not accepted); [] when the runs did not count by position
    reach: list[float] = field(default_factory=list)
    v_at_batch: float = float("nan")
    batch: float = float("nan")
    v_k1: float | None = None  # V(k + 1) on the fitted verify line, k the configured length
    expected_tokens: float | None = None
    ceiling: float | None = None
    efficiency: float | None = None
    adaptive: bool = False
    best_k: int | None = None  # the draft length (1..n_max) with the highest speedup in the model
    best_ceiling: float | None = None  # that speedup: the ceiling efficiency is measured against
    # the adaptive controller's own prediction for its drafting, median over runs (None: not adaptive)
    predicted_speedup: float | None = None
    losses: dict[str, float] = field(default_factory=dict)
    # each drafter's share of the time (a combination's lookups and model apart), from the runs' by_drafter
    draft_share_by_drafter: dict[str, float] = field(default_factory=dict)

    @property
    def kind(self) -> Strategy:
        """The cell's strategy, parsed."""
        return parse_strategy(self.strategy)

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CellResult:
        """A cell read back from :meth:`as_dict` (a bench.json): unknown keys are left out, and a float
        written as null (NaN) is NaN again."""
        known = {f.name: f for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        for name, f in known.items():
            if values.get(name, 0) is None and f.type == "float":
                values[name] = float("nan")
        return cls(**values)


def _seconds_by_drafter(runs: Sequence[dict]) -> dict[str, float]:
    """Seconds per drafter over ``runs`` (their stats' ``by_drafter``; runs written before it: empty)."""
    out: dict[str, float] = {}
    for s in runs:
        for name, counts in (s.get("by_drafter") or {}).items():
            out[name] = out.get(name, 0.0) + float(counts.get("seconds") or 0.0)
    return out


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
        strategy=config.strategy.name,
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
        a=speed.fit_acceptance(accepted / drafting, drafted / drafting) if drafting else 0.0,
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
    by_drafter = _seconds_by_drafter(ss)
    cell.draft_share_by_drafter = {n: secs / total for n, secs in by_drafter.items()} if total else {}
    if rounds and t_dec:
        evals = _sum(ss, "draft_evals")
        uses_model = config.uses_model and evals > 0
        # a draft token's cost: the model's own seconds where the runs told the parts apart (not the lookups')
        model_s = sum(by_drafter.get(n, 0.0) for n in MODEL_SOURCES) if by_drafter else draft_s
        cell.c = (model_s / evals) / t_dec if uses_model else 0.0
        cell.batch = _sum(ss, "verify_tokens") / rounds
        cell.v_at_batch = (verify_s / rounds) / t_dec
        cell.evals_per_round = evals / rounds if uses_model else 0.0
        if drafting:
            by_position = _sum_lists(s.get("accepted_by_position") for s in ss)
            cell.reach = [n / drafting for n in by_position]
            cell.rollback_copies = (_sum(ss, "rollback_seconds") / drafting) / t_dec
            cell.replayed_per_round = _sum(ss, "replayed_tokens") / drafting
        cell.spec_seconds_per_token = total / gen if gen else float("nan")
        cell.base_seconds_per_token = base_total / base_gen if base_gen else float("nan")
    return cell


def fit_verify_line(cells: Sequence[CellResult]) -> speed.VerifyLine | None:
    """The verify line V(b) = v2 + s (b - 2) through every drafting cell's mean pass (its measured cost in
    one-row passes, weighted by its tokens): :meth:`localspec.decoding.speed.VerifyLine.fit`."""
    return speed.VerifyLine.fit((c.batch, c.v_at_batch, c.generated_tokens) for c in cells if c.kind.drafts)


def physical(line: speed.VerifyLine | None) -> bool:
    """A fit a machine can have: a pass of b rows at most b one-row passes (with the noise margin)."""
    return line is not None and line.slope <= MAX_PHYSICAL_SLOPE and line.v2 <= 2 * MAX_PHYSICAL_SLOPE


def _pooled_reach(cells: list[CellResult]) -> dict[tuple[str, str], list[float]]:
    """Per (workload, strategy): the highest reach any of its cells measured at each position. A p_min stop,
    an adaptive length or a shorter n_max only cuts drafts short, which counts as not accepted; the same
    drafter on the same text accepts what it accepts."""
    out: dict[tuple[str, str], list[float]] = {}
    for c in cells:
        row = out.setdefault((c.workload, c.strategy), [])
        for i, r in enumerate(c.reach):
            if i == len(row):
                row.append(r)
            row[i] = max(row[i], r)
    return out


def add_ceilings(cells: list[CellResult], line: speed.VerifyLine | None = None) -> speed.VerifyLine | None:
    """Fill ceiling, efficiency and the loss factors of every speculative cell; returns the verify line used.

    The model is :mod:`localspec.decoding.speed`: reach per position (:func:`_pooled_reach`; the i.i.d.
    acceptance ``a`` where the runs did not count by position), the draft token's cost ``c``, V(b) on a line
    fitted once over all cells through passes of two rows and more (:func:`fit_verify_line`, not forced
    through V(1) = 1), and a recurrent target's rollback per drafting round (its state copies and replayed
    rows; 0 for a transformer). ``ceiling`` is the speedup at the configured length, ``best_ceiling`` at
    the best length in 1..n_max (an adaptive cell may also not draft: never below 1x), and efficiency is
    the speedup over the best one. The loss factors multiply to the efficiency: ``draft_length`` (rounds
    yield fewer tokens or cost other than the ideal round: p_min stops, n-gram misses, rejected tails),
    ``loop_overhead`` (time outside draft and verify passes: sampling, Python; a lookup counts as
    drafting), ``baseline_overhead`` (the same kind of time in the baseline, which counts in our favour)
    and ``residual`` (median-of-prompts vs pooled totals, run-to-run noise).
    """
    spec = [c for c in cells if c.kind.drafts and not math.isnan(c.v_at_batch)]
    if line is None:
        line = fit_verify_line(spec)
    reach = _pooled_reach(spec)
    for c in spec:
        if not physical(line) or not c.drafting_rounds:
            # no verify-cost fit, or a non-physical one (past that the timings were taken on a busy
            # machine), or nothing was drafted: no ceiling to speak of
            continue
        assert line is not None
        _fill_ceiling(c, reach.get((c.workload, c.strategy)) or [], line)
    return line


def _full_round_cost(
    reach: Sequence[float], k: int, *, draft: float, verify: speed.Verify, rollback: float = 0.0
) -> float:
    return speed.round_cost(k, draft=draft, verify=verify, rollback=rollback)


def _fill_ceiling(c: CellResult, pooled: list[float], line: speed.VerifyLine) -> None:
    """One drafting cell's ceilings, efficiency and loss factors (see :func:`add_ceilings`)."""
    k = int(c.n_max or round(c.draft_length) or 1)
    reach = pooled or speed.iid_reach(c.a, k)  # positions never drafted: never accepted
    rollback = c.rollback_copies + line.slope * c.replayed_per_round  # 0 for a transformer target
    c.v_k1 = line(k + 1)
    c.expected_tokens = speed.expected_tokens(reach, k)
    # a round that can end its draft early (p_min, the adaptive length, a lookup's match) is bounded by one
    # that stops at its first rejected token; a fixed-length draft model's by its full k drafts
    stops = c.adaptive or c.kind != DRAFT_MODEL or bool(c.p_min)
    cost = (speed.stopped_round_cost if stops else _full_round_cost)(
        reach, k, draft=c.c, verify=line, rollback=rollback
    )
    c.ceiling = speed.speedup(c.expected_tokens, cost)
    c.best_k, c.best_ceiling = speed.best_length(
        reach, k, draft=c.c, verify=line, rollback=rollback, k_min=0 if c.adaptive else 1, stops=stops
    )
    if not c.best_ceiling or math.isnan(c.speedup):
        return
    c.efficiency = c.speedup / c.best_ceiling
    ideal_round = c.evals_per_round * c.c + c.v_at_batch  # the rounds as measured
    s_len = c.tokens_per_round / ideal_round if ideal_round else float("nan")
    s_ov = c.target_token_seconds / c.spec_seconds_per_token
    base_gain = c.base_seconds_per_token / c.target_token_seconds
    c.losses = {
        "draft_length": s_len / c.best_ceiling,
        "loop_overhead": s_ov / s_len,
        "baseline_overhead": base_gain,
        "residual": c.speedup / (s_ov * base_gain),
    }


def summarise(
    workloads: list[Workload],
    configs: list[DraftSettings],
    records: list[RunRecord],
    line: speed.VerifyLine | None = None,
    engine: str = LOCALSPEC,
) -> tuple[list[CellResult], speed.VerifyLine | None]:
    """Group the counted runs of ``engine`` into one cell per workload and speculative setting."""
    cells = []
    for w in workloads:
        rows = [r for r in records if r.workload == w.name and r.counted and r.engine == engine]
        base = [(r.prompt_id, r.stats) for r in rows if r.config == BASELINE_LABEL]
        for cfg in configs:
            if not cfg.is_speculative:
                continue
            spec = [(r.prompt_id, r.stats) for r in rows if r.config == cfg.label]
            if spec:
                cells.append(summarise_cell(w.name, cfg, base, spec))
    return cells, add_ceilings(cells, line)
