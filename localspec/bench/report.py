"""Benchmark report: one JSON-able dict, written as bench.json, bench.md, a PNG chart and console tables."""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path
from typing import Any

from localspec.bench.arithmetic import MAX_PHYSICAL_SLOPE
from localspec.bench.workloads import WORKLOAD_TITLES
from localspec.units import format_bytes

LOSS_NAMES = {
    "draft_length": "draft length / acceptance pattern",
    "loop_overhead": "loop overhead (sampling, Python)",
    "baseline_overhead": "baseline's own overhead (in our favour)",
    "residual": "median vs pooled, noise",
}


def machine_info(threads: int | None = None) -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, RAM, OS, Python, llama-cpp-python."""
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
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def machine_label(m: dict[str, Any]) -> str:
    cores = m.get("physical_cores") or m.get("logical_cores")
    parts = [f"{m.get('cpu')}", f"{cores}-core CPU", f"{m.get('ram_gib', '?')} GiB RAM"]
    if m.get("threads"):
        parts.append(f"{m['threads']} threads")
    if m.get("llama_cpp_python"):
        parts.append(f"llama-cpp-python {m['llama_cpp_python']}")
    return ", ".join(parts)


def _f(v: Any, fmt: str = "{:.2f}", none: str = "-") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return fmt.format(v)


def peer_lookup(report: dict[str, Any]) -> dict[tuple[str, str], dict]:
    peer = report.get("peer") or {}
    return {(c["workload"], c["config"]): c for c in peer.get("cells", [])}


def rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per workload x config, with the peer's numbers and ours/theirs when present."""
    peers = peer_lookup(report)
    out = []
    for c in report["cells"]:
        p = peers.get((c["workload"], c["config"]))
        ratio = None
        if p and p.get("speedup") and c.get("speedup"):
            ratio = c["speedup"] / p["speedup"]
        out.append(
            {
                **c,
                "peer_speedup": p.get("speedup") if p else None,
                "peer_acceptance": p.get("acceptance_rate") if p else None,
                "ours_over_peer": ratio,
            }
        )
    return out


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
    "llama.cpp",
    "ours/llama.cpp",
]


def _row_cells(r: dict[str, Any]) -> list[str]:
    split = f"{r['draft_share']:.0%}/{r['verify_share']:.0%}/{r['other_share']:.0%}"
    return [
        r["config"],
        f"{r['acceptance_rate']:.0%}",
        _f(r["mean_accepted_length"]),
        _f(r["baseline_tps"], "{:.1f}"),
        _f(r["speculative_tps"], "{:.1f}"),
        _f(r["speedup"], "{:.2f}x"),
        _f(r.get("predicted_speedup"), "{:.2f}x"),
        split,
        _f(r.get("ceiling"), "{:.2f}x"),
        _f(r.get("efficiency"), "{:.0%}"),
        f"{r['best_k']} ({r['best_ceiling']:.2f}x)" if r.get("best_k") and r.get("best_ceiling") else "-",
        _f(r.get("peer_speedup"), "{:.2f}x")
        + (f" ({r['peer_acceptance']:.0%})" if r.get("peer_acceptance") is not None else ""),
        _f(r.get("ours_over_peer")),
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


def _by_workload(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped per workload; after a tuning sweep only the best few per workload."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows(report):
        groups.setdefault(r["workload"], []).append(r)
    if report.get("tuning"):
        groups = {w: rs[:TUNE_ROWS] for w, rs in groups.items()}
    return groups


def _memory_line(report: dict[str, Any]) -> str:
    m = report.get("memory") or {}
    if not m.get("draft_overhead_bytes"):
        return "Draft memory: none (n-gram lookup needs no model)."
    return (
        f"Draft memory: +{format_bytes(m['draft_overhead_bytes'])} = {m['draft_overhead_pct']:.1f}% of the "
        f"target (weights {format_bytes(m['draft_weights_bytes'])} + KV {format_bytes(m['draft_kv_bytes'])}; "
        f"process RSS +{format_bytes(m['draft_rss_delta_bytes'])}). N-gram lookup needs none."
    )


def _losses_line(r: dict[str, Any]) -> str:
    if not r.get("losses"):
        return ""
    parts = [f"{LOSS_NAMES.get(k, k)} x{v:.2f}" for k, v in r["losses"].items()]
    return f"{r['workload']} / {r['config']}: efficiency {_f(r.get('efficiency'), '{:.0%}')} = " + " * ".join(
        parts
    )


def format_text(report: dict[str, Any]) -> str:
    """The console output: a table per workload, then memory and a one-line summary per strategy."""
    out = [report["wide_target"]] if report.get("wide_target") else []
    for w, rs in _by_workload(report).items():
        out.append(f"\n{WORKLOAD_TITLES.get(w, w)} ({rs[0]['prompts']} prompts)")
        out.append(_text_table(HEADERS, [_row_cells(r) for r in rs]))
    out.append("")
    out.append(_memory_line(report))
    out.extend(summary_lines(report))
    return "\n".join(out)


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    by_strategy: dict[str, list[dict]] = {}
    for r in rows(report):
        by_strategy.setdefault(r["config"], []).append(r)
    for label, rs in by_strategy.items():
        sp = [r["speedup"] for r in rs if r.get("speedup")]
        if not sp:
            continue
        geo = math.exp(sum(math.log(s) for s in sp) / len(sp))
        line = f"{label}: speedup {min(sp):.2f}x-{max(sp):.2f}x (geometric mean {geo:.2f}x)"
        ratios = [r["ours_over_peer"] for r in rs if r.get("ours_over_peer")]
        if ratios:
            line += f"; ours/llama.cpp {min(ratios):.2f}-{max(ratios):.2f}"
        lines.append(line)
    tuning = report.get("tuning")
    if tuning:
        for w, t in tuning["workloads"].items():
            lines.append(f"tuned {w}: {t['note']}")
    return lines + noise_lines(report)


#: A speedup this far above its ceiling, or this far from 1x for a strategy that drafted nothing, is
#: timing noise, not a result: no drafter beats what its acceptance and costs allow by a fifth.
NOISE_MARGIN = 0.2


def noise_lines(report: dict[str, Any]) -> list[str]:
    """Warnings for figures no drafter can produce: a speedup far above its ceiling, or far from 1x with
    no draft accepted (then it ran the target alone). They come from a machine busy with something else
    during the run, or from too few tokens to time."""
    odd = []
    for r in rows(report):
        speedup, efficiency = r.get("speedup"), r.get("efficiency")
        if not speedup:
            continue
        if efficiency and efficiency > 1 + NOISE_MARGIN:
            odd.append(f"{r['workload']} / {r['config']} {speedup:.2f}x is {efficiency:.0%} of its ceiling")
        elif not r.get("acceptance_rate") and abs(speedup - 1) > NOISE_MARGIN:
            odd.append(f"{r['workload']} / {r['config']} {speedup:.2f}x with no draft accepted")
    slope = report.get("verify_slope")
    if isinstance(slope, (int, float)) and slope > MAX_PHYSICAL_SLOPE:
        odd.append(f"each extra token of a verify pass fitted at {slope:.3g} one-token passes (1 at most)")
    if not odd:
        return []
    return [
        "warning: timings this run cannot have measured (" + "; ".join(odd) + "): the machine was busy, or "
        "the runs too short to time. Rerun on an idle machine with --repeats 3 and more --max-tokens."
    ]


def write_markdown(report: dict[str, Any], path: Path) -> Path:
    s = report["settings"]
    out = [
        "# localspec bench",
        "",
        f"Machine: {machine_label(report['machine'])}.",
        f"Pair: target `{report['pair'].get('target')}`, draft `{report['pair'].get('draft')}`.",
        *([f"Regime: {report['wide_target']}.", ""] if report.get("wide_target") else []),
        f"Settings: max_tokens {s.get('max_tokens')}, temperature {s.get('temperature')}, "
        f"repeats {s.get('repeats')}, runs interleaved (target alone, then each strategy, per prompt); "
        "speedup = median over prompts of speculative tok/s / target-alone tok/s.",
        "",
        _memory_line(report),
    ]
    for w, rs in _by_workload(report).items():
        out += ["", f"## {WORKLOAD_TITLES.get(w, w)} ({rs[0]['prompts']} prompts)", ""]
        out.append(_md_table(HEADERS, [_row_cells(r) for r in rs]))
    out += ["", "## Summary", ""] + [f"- {ln}" for ln in summary_lines(report)]
    losses = [_losses_line(r) for r in rows(report) if r.get("losses")]
    if losses:
        out += ["", "## Where the rest went (factors multiply to the efficiency)", ""]
        out += [f"- {ln}" for ln in losses]
    if report.get("peer", {}).get("note"):
        out += ["", f"llama.cpp peer: {report['peer']['note']}"]
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def write_json(report: dict[str, Any], path: Path) -> Path:
    def clean(o: Any) -> Any:
        if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
            return None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    path.write_text(json.dumps(clean(report), indent=1) + "\n", encoding="utf-8")
    return path


COLOURS = [(52, 101, 164), (115, 210, 22), (245, 121, 0), (117, 80, 123), (193, 125, 17), (204, 0, 0)]


def write_png(report: dict[str, Any], path: Path) -> Path:
    """Horizontal bars: speedup per workload and setting, llama.cpp's (hatched) under ours, a 1.0x line."""
    from PIL import Image, ImageDraw, ImageFont

    groups = _by_workload(report)
    labels = list(dict.fromkeys(r["config"] for rs in groups.values() for r in rs))
    peered = {r["config"] for rs in groups.values() for r in rs if r.get("peer_speedup")}
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
        note = "hatched: llama.cpp's own speculative decoding, same setting"
        legend.append((next(iter(peered)), True, note))
    places = _legend_places([t for _, _, t in legend], lambda t: probe.textlength(t, font=font), width)
    rows = 1 + max((row for _, row in places), default=0)
    height = top + len(groups) * (len(series) * bar + gap) + 20 + rows * 18 + 10
    img = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(img)
    vals = [r.get(k) or 0 for rs in groups.values() for r in rs for k in ("speedup", "peer_speedup")]
    vmax = max(1.5, max(vals, default=1.0) * 1.1)
    plot_w = width - left - 40
    x_of = lambda v: left + int(plot_w * v / vmax)  # noqa: E731
    d.text((10, 10), "Speedup over the target alone (median over prompts)", fill="black", font=font)
    y = top
    for w, rs in groups.items():
        d.text((10, y + 2), WORKLOAD_TITLES.get(w, w), fill="black", font=font)
        by_cfg = {r["config"]: r for r in rs}
        for lbl, is_peer in series:
            r = by_cfg.get(lbl)
            v = (r.get("peer_speedup") if is_peer else r.get("speedup")) if r else None
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


def write_all(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return {
        "json": write_json(report, out_dir / "bench.json"),
        "markdown": write_markdown(report, out_dir / "bench.md"),
        "png": write_png(report, out_dir / "bench.png"),
    }
