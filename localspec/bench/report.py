"""Benchmark report: one :class:`BenchReport` record, written as bench.json, bench.md, a PNG chart and
console tables, and read back from bench.json (``localspec bench --from-json``)."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.bench.arithmetic import MAX_PHYSICAL_SLOPE, CellResult
from localspec.bench.tuning import Tuning
from localspec.bench.workloads import WORKLOAD_TITLES, RunRecord
from localspec.decoding.speed import VerifyLine
from localspec.units import format_bytes

LOSS_NAMES = {
    "draft_length": "draft length / acceptance pattern",
    "loop_overhead": "loop overhead (sampling, Python)",
    "baseline_overhead": "baseline's own overhead (in our favour)",
    "residual": "median vs pooled, noise",
}


def machine_info(threads: int | None = None) -> dict[str, Any]:
    """What the numbers were measured on, and when: CPU, cores, RAM, OS, Python, llama-cpp-python, the date
    (``measured``, UTC, YYYY-MM-DD)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "threads": threads,
        "measured": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
    }
    try:
        import psutil

        info["physical_cores"] = psutil.cpu_count(logical=False)
        info["ram_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # pragma: no cover - psutil is a dependency; be robust anyway
        pass
    try:
        from importlib.metadata import version

        info["llama_cpp_python"] = version("llama-cpp-python")
    except Exception:
        info["llama_cpp_python"] = None
    try:
        info["gpu"] = "none (CPU only)" if not _gpu_offload() else "GPU offload available"
    except Exception:
        info["gpu"] = None
    return info


def _gpu_offload() -> bool:
    """A GPU here (a CPU build with llama.cpp's RPC backend says it offloads: to rpc-servers only)."""
    from localspec.llama.loading import supports_gpu_offload

    return supports_gpu_offload()


def machine_label(m: dict[str, Any]) -> str:
    cores = m.get("physical_cores") or m.get("logical_cores")
    parts = [f"{m.get('cpu')}", f"{cores}-core CPU", f"{m.get('ram_gib', '?')} GiB RAM"]
    if m.get("threads"):
        parts.append(f"{m['threads']} threads")
    if m.get("llama_cpp_python"):
        parts.append(f"llama-cpp-python {m['llama_cpp_python']}")
    if m.get("measured"):
        parts.append(f"measured {m['measured']}")
    return ", ".join(parts)


def _f(v: Any, fmt: str = "{:.2f}", none: str = "-") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return fmt.format(v)


@dataclass
class PeerResult:
    """llama.cpp's side of a ``--peer`` run: its cells (its own target alone as their baseline)."""

    cells: list[CellResult]
    note: str = ""


#: How much of each run's generated text bench.json keeps.
RUN_TEXT_CHARS = 300


@dataclass
class BenchReport:
    """What one ``localspec bench`` measured: where, with what, each cell, and llama.cpp's side.

    Written as bench.json by :meth:`as_json` (the keys are the fields; a cell is
    :meth:`~localspec.bench.arithmetic.CellResult.as_dict`) and read back by :meth:`from_json`."""

    machine: dict[str, Any]  # machine_info(): CPU, cores, RAM, OS, versions
    settings: dict[str, Any]  # max_tokens, temperature, repeats, threads, workloads, ...
    pair: dict[str, Any]  # target, draft, verdict, n_ctx, n_max, p_min, placement
    cells: list[CellResult]  # one per workload x speculative setting, ours
    memory: dict[str, Any] = field(default_factory=dict)  # MemoryReport.as_dict()
    verify_line: VerifyLine | None = None  # V(b) fitted over our cells (None: no fit)
    runs: list[RunRecord] = field(default_factory=list)  # every run (written with its text cut to 300 chars)
    peer: PeerResult | None = None
    wide_target: str | None = None  # the line saying how the target was re-encoded (--wide-target)
    tuning: Tuning | None = None  # --tune: the sweep per workload, the winners, presets saved

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "machine": self.machine,
            "settings": self.settings,
            "pair": self.pair,
            "memory": self.memory,
            "verify_slope": self.verify_line.slope if self.verify_line else None,
            "verify_v2": self.verify_line.v2 if self.verify_line else None,
            "cells": [c.as_dict() for c in self.cells],
            "runs": [r.as_dict(text_chars=RUN_TEXT_CHARS) for r in self.runs],
        }
        if self.peer is not None:
            out["peer"] = {"cells": [c.as_dict() for c in self.peer.cells], "note": self.peer.note}
        if self.wide_target:
            out["wide_target"] = self.wide_target
        if self.tuning is not None:
            out["tuning"] = self.tuning.as_dict()
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BenchReport:
        """A report read back from bench.json (one written before the verify line kept only its slope,
        through V(1) = 1: its line is that one)."""
        slope, v2 = d.get("verify_slope"), d.get("verify_v2")
        line = None
        if isinstance(slope, (int, float)):
            line = VerifyLine(v2=float(v2) if isinstance(v2, (int, float)) else 1.0 + slope, slope=slope)
        peer = d.get("peer")
        cells = [CellResult.from_dict(c) for c in d.get("cells") or []]
        return cls(
            machine=dict(d.get("machine") or {}),
            settings=dict(d.get("settings") or {}),
            pair=dict(d.get("pair") or {}),
            cells=cells,
            memory=dict(d.get("memory") or {}),
            verify_line=line,
            runs=[RunRecord.from_dict(r) for r in d.get("runs") or []],
            peer=PeerResult([CellResult.from_dict(c) for c in peer.get("cells") or []], peer.get("note", ""))
            if peer
            else None,
            wide_target=d.get("wide_target"),
            tuning=Tuning.from_dict(d["tuning"], cells) if d.get("tuning") else None,
        )


@dataclass(frozen=True)
class Row:
    """One line of the tables: our cell and llama.cpp's best setting of the same strategy on its workload."""

    cell: CellResult
    peer: CellResult | None = None

    @property
    def ours_over_peer(self) -> float | None:
        """Our speedup over llama.cpp's, each over its own target alone."""
        p, c = self.peer, self.cell
        if p is None or not _number(p.speedup) or not _number(c.speedup):
            return None
        return c.speedup / p.speedup


def _number(v: float | None) -> bool:
    return v is not None and not math.isnan(v) and v != 0


def best_peer(report: BenchReport, workload: str, strategy: str) -> CellResult | None:
    """llama.cpp at its best: the setting of ``strategy`` with the highest speedup on ``workload``."""
    cells = [
        c
        for c in (report.peer.cells if report.peer else [])
        if c.workload == workload and c.strategy == strategy and _number(c.speedup)
    ]
    return max(cells, key=lambda c: c.speedup, default=None)


def rows(report: BenchReport) -> list[Row]:
    """One row per workload x config, with llama.cpp at its best for the same strategy when it ran."""
    return [Row(c, best_peer(report, c.workload, c.strategy)) for c in report.cells]


HEADERS = [
    "config",
    "accept",
    "acc/round",
    "target tok/s",
    "spec tok/s",
    "speedup",
    "predicted",
    "draft/verify/other",
    "ceiling",
    "efficiency",
    "best k",
    "llama.cpp at its best",
    "ours/llama.cpp",
]


def _row_cells(r: Row) -> list[str]:
    c, p = r.cell, r.peer
    split = f"{c.draft_share:.0%}/{c.verify_share:.0%}/{c.other_share:.0%}"
    if len(c.draft_share_by_drafter) > 1:  # a combination: the draft time by part
        split += " (" + ", ".join(f"{n} {x:.0%}" for n, x in sorted(c.draft_share_by_drafter.items())) + ")"
    peer = "-"
    if p is not None:
        setting = p.config.removeprefix(f"{p.strategy} ")
        peer = f"{_f(p.speedup, '{:.2f}x')} ({p.acceptance_rate:.0%}, {setting})"
    return [
        c.config,
        f"{c.acceptance_rate:.0%}",
        _f(c.mean_accepted_length),
        _f(c.baseline_tps, "{:.1f}"),
        _f(c.speculative_tps, "{:.1f}"),
        _f(c.speedup, "{:.2f}x"),
        _f(c.predicted_speedup, "{:.2f}x"),
        split,
        _f(c.ceiling, "{:.2f}x"),
        _f(c.efficiency, "{:.0%}"),
        f"{c.best_k} ({c.best_ceiling:.2f}x)" if c.best_k and c.best_ceiling else "-",
        peer,
        _f(r.ours_over_peer),
    ]


def _text_table(headers: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join(
        [line, sep, *("  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) for b in body)]
    )


def _md_table(headers: list[str], body: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    out += ["| " + " | ".join(b) + " |" for b in body]
    return "\n".join(out)


TUNE_ROWS = 8


def _by_workload(report: BenchReport) -> dict[str, list[Row]]:
    """Rows grouped per workload; after a tuning sweep only the best few per workload."""
    groups: dict[str, list[Row]] = {}
    for r in rows(report):
        groups.setdefault(r.cell.workload, []).append(r)
    if report.tuning:
        groups = {w: rs[:TUNE_ROWS] for w, rs in groups.items()}
    return groups


def _memory_line(report: BenchReport) -> str:
    m = report.memory
    if not m.get("draft_overhead_bytes"):
        return "Draft memory: none (n-gram lookup needs no model)."
    return (
        f"Draft memory: +{format_bytes(m['draft_overhead_bytes'])} = {m['draft_overhead_pct']:.1f}% of the "
        f"target (weights {format_bytes(m['draft_weights_bytes'])} + KV {format_bytes(m['draft_kv_bytes'])}; "
        f"process RSS +{format_bytes(m['draft_rss_delta_bytes'])}). N-gram lookup needs none."
    )


def _losses_line(c: CellResult) -> str:
    if not c.losses:
        return ""
    parts = [f"{LOSS_NAMES.get(k, k)} x{v:.2f}" for k, v in c.losses.items()]
    return f"{c.workload} / {c.config}: efficiency {_f(c.efficiency, '{:.0%}')} = " + " * ".join(parts)


def format_text(report: BenchReport) -> str:
    """The console output: a table per workload, then memory and a one-line summary per strategy."""
    out = [report.wide_target] if report.wide_target else []
    for w, rs in _by_workload(report).items():
        out.append(f"\n{WORKLOAD_TITLES.get(w, w)} ({rs[0].cell.prompts} prompts)")
        out.append(_text_table(HEADERS, [_row_cells(r) for r in rs]))
    out.append("")
    out.append(_memory_line(report))
    out.extend(summary_lines(report))
    return "\n".join(out)


def summary_lines(report: BenchReport) -> list[str]:
    lines = []
    by_strategy: dict[str, list[Row]] = {}
    for r in rows(report):
        by_strategy.setdefault(r.cell.config, []).append(r)
    for label, rs in by_strategy.items():
        sp = [r.cell.speedup for r in rs if _number(r.cell.speedup)]
        if not sp:
            continue
        geo = math.exp(sum(math.log(s) for s in sp) / len(sp))
        line = f"{label}: speedup {min(sp):.2f}x-{max(sp):.2f}x (geometric mean {geo:.2f}x)"
        ratios = [x for r in rs if (x := r.ours_over_peer)]
        if ratios:
            line += f"; ours/llama.cpp at its best {min(ratios):.2f}-{max(ratios):.2f}"
        lines.append(line)
    lines += best_against_best_lines(report) + auto_lines(report)
    if report.tuning:
        for w, t in report.tuning.workloads.items():
            lines.append(f"tuned {w}: {t.note}")
    return lines + noise_lines(report)


def best_against_best_lines(report: BenchReport) -> list[str]:
    """Per workload: ours at our best over llama.cpp at its best, in tokens/s (the same token ids)."""
    if report.peer is None:
        return []
    out = []
    for w in dict.fromkeys(c.workload for c in report.cells):
        ours = _fastest(c for c in report.cells if c.workload == w)
        theirs = _fastest(c for c in report.peer.cells if c.workload == w)
        if ours is not None and theirs is not None:
            out.append(
                f"{w}: ours at its best ({ours.config}) / llama.cpp at its best ({theirs.config}): "
                f"{ours.speculative_tps / theirs.speculative_tps:.2f} (tokens/s)"
            )
    return out


def auto_lines(report: BenchReport) -> list[str]:
    """Per workload where ``auto`` ran beside fixed settings: its speedup over the best fixed one's."""
    out = []
    for w in dict.fromkeys(c.workload for c in report.cells):
        cells = [c for c in report.cells if c.workload == w and _number(c.speedup)]
        autos = [c for c in cells if c.kind.routed]
        fixed = [c for c in cells if not c.kind.routed and not c.adaptive]
        if autos and fixed:
            best = max(fixed, key=lambda c: c.speedup)
            out += [
                f"{w}: {a.config} / the best fixed ({best.config}): {a.speedup / best.speedup:.2f}"
                for a in autos
            ]
    return out


def _fastest(cells: Any) -> CellResult | None:
    usable = [c for c in cells if _number(c.speculative_tps)]
    return max(usable, key=lambda c: c.speculative_tps, default=None)


#: A speedup this far above its ceiling, or this far from 1x for a strategy that drafted nothing, is
#: timing noise, not a result: no drafter beats what its acceptance and costs allow by a fifth.
NOISE_MARGIN = 0.2


def noise_lines(report: BenchReport) -> list[str]:
    """Warnings for figures no drafter can produce: a speedup far above its ceiling, or far from 1x with
    no draft accepted (then it ran the target alone). They come from a machine busy with something else
    during the run, or from too few tokens to time."""
    odd = []
    for c in report.cells:
        if not _number(c.speedup):
            continue
        if c.efficiency and c.efficiency > 1 + NOISE_MARGIN:
            odd.append(f"{c.workload} / {c.config} {c.speedup:.2f}x is {c.efficiency:.0%} of its ceiling")
        elif not c.acceptance_rate and abs(c.speedup - 1) > NOISE_MARGIN:
            odd.append(f"{c.workload} / {c.config} {c.speedup:.2f}x with no draft accepted")
    line = report.verify_line
    if line is not None and line.slope > MAX_PHYSICAL_SLOPE:
        odd.append(
            f"each extra token of a verify pass fitted at {line.slope:.3g} one-token passes (1 at most)"
        )
    if not odd:
        return []
    return [
        "warning: timings this run cannot have measured (" + "; ".join(odd) + "): the machine was busy, or "
        "the runs too short to time. Rerun on an idle machine with --repeats 3 and more --max-tokens."
    ]


def write_markdown(report: BenchReport, path: Path) -> Path:
    s = report.settings
    out = [
        "# localspec bench",
        "",
        f"Machine: {machine_label(report.machine)}.",
        f"Pair: target `{report.pair.get('target')}`, draft `{report.pair.get('draft')}`.",
        *([f"Regime: {report.wide_target}.", ""] if report.wide_target else []),
        f"Settings: max_tokens {s.get('max_tokens')}, temperature {s.get('temperature')}, "
        f"repeats {s.get('repeats')}, runs interleaved (target alone, then each strategy, per prompt); "
        "speedup = median over prompts of speculative tok/s / target-alone tok/s.",
        "",
        _memory_line(report),
    ]
    for w, rs in _by_workload(report).items():
        out += ["", f"## {WORKLOAD_TITLES.get(w, w)} ({rs[0].cell.prompts} prompts)", ""]
        out.append(_md_table(HEADERS, [_row_cells(r) for r in rs]))
    out += ["", "## Summary", ""] + [f"- {ln}" for ln in summary_lines(report)]
    losses = [_losses_line(c) for c in report.cells if c.losses]
    if losses:
        out += ["", "## Where the rest went (factors multiply to the efficiency)", ""]
        out += [f"- {ln}" for ln in losses]
    if report.peer is not None and report.peer.note:
        out += ["", f"llama.cpp peer: {report.peer.note}"]
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def json_text(report: BenchReport) -> str:
    """bench.json's text: the report's :meth:`~BenchReport.as_json`, NaN and infinities as null."""

    def clean(o: Any) -> Any:
        if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
            return None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    return json.dumps(clean(report.as_json()), indent=1)


def write_json(report: BenchReport, path: Path) -> Path:
    path.write_text(json_text(report) + "\n", encoding="utf-8")
    return path


def read_json(path: Path) -> BenchReport:
    """A bench.json written by :func:`write_json`, as a report again."""
    return BenchReport.from_json(json.loads(path.read_text(encoding="utf-8")))


COLOURS = [(52, 101, 164), (115, 210, 22), (245, 121, 0), (117, 80, 123), (193, 125, 17), (204, 0, 0)]


def write_png(report: BenchReport, path: Path) -> Path:
    """Horizontal bars: speedup per workload and setting, llama.cpp's (hatched) under ours, a 1.0x line."""
    from PIL import Image, ImageDraw, ImageFont

    groups = _by_workload(report)
    labels = list(dict.fromkeys(r.cell.config for rs in groups.values() for r in rs))
    peered = {r.cell.config for rs in groups.values() for r in rs if r.peer is not None}
    series = [(lbl, p) for lbl in labels for p in ((False, True) if lbl in peered else (False,))]
    colour_of = {lbl: COLOURS[i % len(COLOURS)] for i, lbl in enumerate(labels)}
    bar, gap, left, top, width = 14, 12, 150, 60, 900
    try:
        font = ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1
        font = ImageFont.load_default()
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    legend = [(lbl, False, lbl) for lbl in labels]
    if peered:
        note = "hatched: llama.cpp's own speculative decoding at its best, same strategy"
        legend.append((next(iter(peered)), True, note))
    places = _legend_places([t for _, _, t in legend], lambda t: probe.textlength(t, font=font), width)
    rows = 1 + max((row for _, row in places), default=0)
    height = top + len(groups) * (len(series) * bar + gap) + 20 + rows * 18 + 10
    img = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(img)
    vals = [v or 0 for rs in groups.values() for r in rs for v in _bar_values(r)]
    vmax = max(1.5, max(vals, default=1.0) * 1.1)
    plot_w = width - left - 40
    x_of = lambda v: left + int(plot_w * v / vmax)  # noqa: E731
    d.text((10, 10), "Speedup over the target alone (median over prompts)", fill="black", font=font)
    y = top
    for w, rs in groups.items():
        d.text((10, y + 2), WORKLOAD_TITLES.get(w, w), fill="black", font=font)
        by_cfg = {r.cell.config: r for r in rs}
        for lbl, is_peer in series:
            r = by_cfg.get(lbl)
            v = _bar_values(r)[1 if is_peer else 0] if r else None
            if v:
                _bar(d, left, y, x_of(v), bar, colour_of[lbl], is_peer)
                d.text((x_of(v) + 4, y), f"{v:.2f}x", fill="black", font=font)
            y += bar
        y += gap
    d.line([x_of(1.0), top - 8, x_of(1.0), y], fill=(80, 80, 80), width=2)
    d.text((x_of(1.0) - 12, top - 24), "1.0x", fill="black", font=font)
    for (lbl, is_peer, text), (lx, row) in zip(legend, places, strict=True):
        ly = y + 10 + 18 * row
        _bar(d, lx, ly, lx + 12, 11, colour_of[lbl] if not is_peer else (90, 90, 90), is_peer)
        d.text((lx + 16, ly - 2), text, fill="black", font=font)
    img.save(path, format="PNG", optimize=True)
    return path


def _bar_values(r: Row) -> tuple[float | None, float | None]:
    """Ours and llama.cpp's speedup for a row (None where there is none or it is not a number)."""
    ours = r.cell.speedup if _number(r.cell.speedup) else None
    theirs = r.peer.speedup if r.peer is not None and _number(r.peer.speedup) else None
    return ours, theirs


def _legend_places(texts: list[str], text_width, width: int) -> list[tuple[int, int]]:
    """(x, row) of each legend entry: a swatch and its text, wrapped to the image width."""
    out, lx, row = [], 10, 0
    for text in texts:
        w = 24 + int(text_width(text))
        if lx + w > width - 10 and lx > 10:
            lx, row = 10, row + 1
        out.append((lx, row))
        lx += w
    return out


def _bar(d, x0: int, y: int, x1: int, h: int, colour, hatched: bool) -> None:
    d.rectangle([x0, y, x1, y + h - 2], fill="white" if hatched else colour, outline=colour)
    if hatched:
        for hx in range(x0, x1, 6):
            d.line([hx, y + h - 2, min(hx + 6, x1), y], fill=colour)


def write_all(report: BenchReport, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return {
        "json": write_json(report, out_dir / "bench.json"),
        "markdown": write_markdown(report, out_dir / "bench.md"),
        "png": write_png(report, out_dir / "bench.png"),
    }
