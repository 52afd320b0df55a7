"""What a tuning sweep (``localspec bench --tune``) found: per workload its cells ranked and the winner,
and the winner over all workloads. :mod:`localspec.bench.tune` runs the sweep; a report writes these
(:meth:`Tuning.as_dict`) and reads them back (:meth:`Tuning.from_dict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from localspec.bench.arithmetic import CellResult
from localspec.settings import BASELINE

#: What a tuned workload's cells keep in bench.json (the whole cell is among the report's cells).
CELL_KEYS = (
    "config",
    "strategy",
    "n_max",
    "p_min",
    "adaptive",
    "speedup",
    "acceptance_rate",
    "speculative_tps",
    "baseline_tps",
)


@dataclass(frozen=True)
class Winner:
    """The setting a sweep picked, and its speedup over the target alone (the target alone itself, at 1.0,
    when nothing beat it by the margin)."""

    config: str  # DraftSettings.label
    strategy: str
    n_max: int | None = None
    p_min: float | None = None
    adaptive: bool = False
    speedup: float = 1.0

    @classmethod
    def of(cls, cell: CellResult, speedup: float | None = None) -> Winner:
        """The setting of ``cell``, at its own speedup unless ``speedup`` is given (a mean over workloads)."""
        return cls(
            config=cell.config,
            strategy=cell.strategy,
            n_max=cell.n_max,
            p_min=cell.p_min,
            adaptive=cell.adaptive,
            speedup=cell.speedup if speedup is None else speedup,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "strategy": self.strategy,
            "n_max": self.n_max,
            "p_min": self.p_min,
            "adaptive": self.adaptive,
            "speedup": self.speedup,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Winner:
        return cls(
            config=str(d["config"]),
            strategy=str(d["strategy"]),
            n_max=d.get("n_max"),
            p_min=d.get("p_min"),
            adaptive=bool(d.get("adaptive")),
            speedup=float(d.get("speedup") or 1.0),
        )


#: The tuner's honest answer when nothing beats the target alone.
TARGET_ALONE = Winner(config=BASELINE.label, strategy=BASELINE.strategy.name)


@dataclass
class WorkloadTuning:
    """One workload's sweep: its cells, fastest first, the winner and the line that says why."""

    cells: list[CellResult]
    winner: Winner
    note: str

    def as_dict(self) -> dict[str, Any]:
        cells = [{k: getattr(c, k) for k in CELL_KEYS} for c in self.cells]
        return {"winner": self.winner.as_dict(), "note": self.note, "cells": cells}


@dataclass
class Tuning:
    """A whole sweep: the settings swept, the margin a winner must beat the target alone by, each
    workload's result, the overall winner and the presets saved from them."""

    configs: list[str]  # the labels swept
    margin: float
    workloads: dict[str, WorkloadTuning]
    overall: Winner = TARGET_ALONE
    saved: list[str] = field(default_factory=list)  # the preset files written (--save-preset)
    replaced: list[str] = field(default_factory=list)  # those of them that held a preset before

    def as_dict(self) -> dict[str, Any]:
        return {
            "configs": self.configs,
            "margin": self.margin,
            "workloads": {w: t.as_dict() for w, t in self.workloads.items()},
            "overall": self.overall.as_dict(),
            "saved": self.saved,
            "replaced": self.replaced,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], cells: list[CellResult]) -> Tuning:
        """A sweep read back from :meth:`as_dict`; each workload's cells are those of the report's ``cells``
        it names."""
        workloads = {}
        for w, t in (d.get("workloads") or {}).items():
            mine = {c.config: c for c in cells if c.workload == w}
            ranked = [mine[c["config"]] for c in t.get("cells") or [] if c.get("config") in mine]
            workloads[w] = WorkloadTuning(ranked, Winner.from_dict(t["winner"]), str(t.get("note") or ""))
        return cls(
            configs=list(d.get("configs") or []),
            margin=float(d.get("margin") or 0.0),
            workloads=workloads,
            overall=Winner.from_dict(d["overall"]) if d.get("overall") else TARGET_ALONE,
            saved=list(d.get("saved") or []),
            replaced=list(d.get("replaced") or []),
        )


def ranked(cells: list[CellResult]) -> list[CellResult]:
    """Cells fastest first (a cell without a speedup last)."""
    return sorted(cells, key=lambda c: -(c.speedup if not math.isnan(c.speedup) else 0))
