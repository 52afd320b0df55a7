"""Measurements carried by every result: acceptance, timings, memory. Knows nothing else."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from localspec.decoding.routing import Route
from localspec.settings import TARGET_ALONE, Strategy

MB = 1024 * 1024


def rss_bytes() -> int:
    """Resident set size of this process, in bytes."""
    return psutil.Process().memory_info().rss


def available_bytes() -> int:
    """Memory the system can give without swapping, in bytes (psutil's ``available``)."""
    return int(psutil.virtual_memory().available)


@dataclass
class MemoryReport:
    """What each model costs in memory, and what the draft adds on top of the target alone."""

    target_weights_bytes: int = 0
    target_kv_bytes: int = 0
    draft_weights_bytes: int = 0
    draft_kv_bytes: int = 0
    rss_baseline_bytes: int = 0
    rss_after_target_bytes: int = 0
    rss_after_draft_bytes: int = 0

    @property
    def draft_rss_delta_bytes(self) -> int:
        if not self.rss_after_draft_bytes:
            return 0
        return max(0, self.rss_after_draft_bytes - self.rss_after_target_bytes)

    @property
    def draft_overhead_bytes(self) -> int:
        return self.draft_weights_bytes + self.draft_kv_bytes

    @property
    def target_bytes(self) -> int:
        return self.target_weights_bytes + self.target_kv_bytes

    @property
    def draft_overhead_pct(self) -> float:
        return 100.0 * self.draft_overhead_bytes / self.target_bytes if self.target_bytes else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            draft_rss_delta_bytes=self.draft_rss_delta_bytes,
            draft_overhead_bytes=self.draft_overhead_bytes,
            draft_overhead_pct=round(self.draft_overhead_pct, 2),
        )
        return d

    def summary(self) -> str:
        if not self.draft_overhead_bytes:
            return "draft memory: none"
        return (
            f"draft memory +{self.draft_overhead_bytes / MB:.1f} MB "
            f"({self.draft_overhead_pct:.1f}% of target; weights {self.draft_weights_bytes / MB:.1f} MB, "
            f"KV {self.draft_kv_bytes / MB:.1f} MB, RSS +{self.draft_rss_delta_bytes / MB:.1f} MB)"
        )


@dataclass
class DrafterCounts:
    """One drafter's part in a generation, as llama.cpp's ``common_speculative`` counts per implementation: a
    combination (lookups with a draft model) has one per part, so its lookup time and model time are told
    apart."""

    calls: int = 0  # times it was asked for a draft (a free lookup included)
    rounds: int = 0  # verify rounds its draft went into
    drafted: int = 0  # tokens it drafted (verified by the target)
    accepted: int = 0  # of them, accepted
    seconds: float = 0.0  # spent drafting, all its calls

    @property
    def seconds_per_call(self) -> float:
        return self.seconds / self.calls if self.calls else 0.0


@dataclass
class GenerationStats:
    """Running measurements of one generation; the engine updates it in place.

    Each :class:`~localspec.decoding.engine.TokenResponse` carries a :meth:`snapshot` (the counts as they
    stood when
    that token was emitted), so the first token never shows the final totals.
    """

    strategy: Strategy = TARGET_ALONE
    draft_name: str | None = None
    pairing_note: str = ""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    draft_evals: int = 0
    verify_tokens: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    # Per source of drafted tokens (see localspec.decoding.drafters.SOURCES): drafted and accepted counts.
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    # Per drafter by its name (model, mtp, ngram, suffix; a combination's parts apart): calls, rounds, drafted
    # and accepted tokens, and seconds.
    by_drafter: dict[str, DrafterCounts] = field(default_factory=dict)
    prompt_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    sample_seconds: float = 0.0
    # A target with recurrent memory: seconds copying its state out and back to take drafts back, and the
    # accepted tokens evaluated again after a restore (both 0 for a transformer: llama/recurrent.py).
    rollback_seconds: float = 0.0
    replayed_tokens: int = 0
    total_seconds: float = 0.0
    speedup: float | None = None
    finish_reason: str | None = None
    memory: MemoryReport = field(default_factory=MemoryReport)
    # Where each model runs, e.g. {"target": "CPU", "draft": "GPU (all layers)"}.
    placement: dict[str, str] = field(default_factory=dict)
    # The "auto" strategy's decision for this request and why (None when a strategy was named); as_dict()
    # writes it as one line, "auto -> suffix: why" ("" when None).
    route: Route | None = None
    # What the adaptive controller's measurements predicted for drafting at its best length, in
    # target-alone units (None without an adaptive setting or before its costs were measured).
    predicted_speedup: float | None = None
    # Drafted tokens left out of a pass shared with other requests because their rows would not pay for
    # themselves there (:func:`localspec.decoding.speed.batch_lengths`; 0 when it ran alone).
    batch_cut: int = 0

    # Derived values -----------------------------------------------------------------------------
    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted drafts per verification round."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.generated_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [
            a / d if d else 0.0
            for a, d in zip(self.accepted_by_position, self.drafted_by_position, strict=True)
        ]

    @property
    def acceptance_by_source(self) -> dict[str, float]:
        """Accepted / drafted per source of drafted tokens (model, prompt, history, corpus)."""
        return {k: self.accepted_by_source.get(k, 0) / d for k, d in self.drafted_by_source.items() if d}

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    # Bookkeeping used by the engine (cheap: a few integer adds per round) --------------------------
    def record_calls(self, seconds_by_drafter: dict[str, float]) -> None:
        """One round's drafting: each drafter asked, and the seconds it took."""
        for name, seconds in seconds_by_drafter.items():
            counts = self.by_drafter.setdefault(name, DrafterCounts())
            counts.calls += 1
            counts.seconds += seconds

    def record_round(
        self, n_drafted: int, n_accepted: int, sources: list[str] | None = None, drafter: str = ""
    ) -> None:
        """One verify round: ``n_drafted`` drafts by ``drafter`` (its name), the first ``n_accepted``
        accepted; ``sources`` says where each draft came from."""
        self.rounds += 1
        if n_drafted and drafter:
            counts = self.by_drafter.setdefault(drafter, DrafterCounts())
            counts.rounds += 1
            counts.drafted += n_drafted
            counts.accepted += n_accepted
        for i, src in enumerate(sources or ()):
            if i >= n_drafted:
                break
            self.drafted_by_source[src] = self.drafted_by_source.get(src, 0) + 1
            if i < n_accepted:
                self.accepted_by_source[src] = self.accepted_by_source.get(src, 0) + 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        grow = n_drafted - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for i in range(n_drafted):
            self.drafted_by_position[i] += 1
        for i in range(n_accepted):
            self.accepted_by_position[i] += 1

    def snapshot(self) -> GenerationStats:
        """A copy that later updates do not change (the memory report is shared: it is fixed at load)."""
        snap = copy.copy(self)
        snap.drafted_by_position = list(self.drafted_by_position)
        snap.accepted_by_position = list(self.accepted_by_position)
        snap.drafted_by_source = dict(self.drafted_by_source)
        snap.accepted_by_source = dict(self.accepted_by_source)
        snap.by_drafter = {name: copy.copy(c) for name, c in self.by_drafter.items()}
        snap.placement = dict(self.placement)
        return snap

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["memory"] = self.memory.as_dict()
        d["strategy"] = self.strategy.name
        d["route"] = str(self.route) if self.route else ""
        d.update(
            acceptance_by_source={k: round(v, 4) for k, v in self.acceptance_by_source.items()},
            acceptance_rate=round(self.acceptance_rate, 4),
            mean_accepted_length=round(self.mean_accepted_length, 3),
            tokens_per_round=round(self.tokens_per_round, 3),
            acceptance_by_position=[round(x, 4) for x in self.acceptance_by_position],
            tokens_per_second=round(self.tokens_per_second, 3),
            prompt_tokens_per_second=round(self.prompt_tokens_per_second, 2),
        )
        return d

    def summary_line(self) -> str:
        parts = [f"{self.generated_tokens} tokens", f"{self.tokens_per_second:.1f} tok/s"]
        if self.route:
            parts.append(self.route.label)  # "auto -> suffix"; the reason is in as_dict()
        if self.strategy.drafts:
            parts.append(f"strategy {self.strategy.name}")
            if self.drafted:
                parts.append(f"acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.drafted})")
            else:  # "0% (0/0)" read as every proposal refused
                parts.append("nothing drafted")
            # what drafting bought: 1.00 is the target alone's (mean accepted length counts rounds
            # that drafted nothing too, and read as a contradiction next to a high acceptance)
            parts.append(f"{self.tokens_per_round:.2f} tokens per target pass")
            if self.drafted_by_source and set(self.drafted_by_source) != {"model"}:
                by = ", ".join(
                    f"{src} {self.accepted_by_source.get(src, 0)}/{n}"
                    for src, n in sorted(self.drafted_by_source.items())
                )
                parts.append(f"accepted by source: {by}")
            if len(self.by_drafter) > 1:  # a combination: what each part's drafting cost
                spent = ", ".join(f"{n} {c.seconds:.2f} s" for n, c in sorted(self.by_drafter.items()))
                parts.append(f"drafting time: {spent}")
        else:
            parts.append("target alone")
        if self.speedup is not None:
            parts.append(f"speedup {self.speedup:.2f}x vs target alone")
        if self.strategy.model or self.strategy.mtp:
            parts.append(self.memory.summary())
        if self.placement:
            parts.append("runs on " + ", ".join(f"{role} {where}" for role, where in self.placement.items()))
        return " | ".join(parts)


@dataclass
class Comparison:
    """Target alone and speculative on the same prompt, interleaved in one process.

    ``same_text`` compares the last run of each side: greedy, the texts part only at near-ties of the
    target's logits (batching moves them); sampled, they are two draws of the same distribution and
    differ by design, so it says nothing there.
    """

    baseline: Any
    speculative: Any
    speedup: float
    baseline_tps: list[float] = field(default_factory=list)
    speculative_tps: list[float] = field(default_factory=list)
    same_text: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "speedup": round(self.speedup, 4),
            "baseline_tokens_per_second": self.baseline_tps,
            "speculative_tokens_per_second": self.speculative_tps,
            "same_text": self.same_text,
            "baseline": self.baseline.stats.as_dict(),
            "speculative": self.speculative.stats.as_dict(),
        }
