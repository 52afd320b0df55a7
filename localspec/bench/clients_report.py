"""The clients bench's result: rows per setting and client count, its file (``clients.json``, which the docs
render), its table and its plot.

A row's throughput is the median over repeats of a level's tokens per wall-clock second; its latency and
time-to-first-token percentiles are over every request of every repeat; its acceptance is accepted over
drafted tokens of all of them (None where nothing was drafted).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from localspec.bench.clients import LevelRun
from localspec.bench.report import machine_info
from localspec.errors import BenchError

#: What the result file says it is (``bench --from-json`` tells it from a bench.json by this).
KIND = "localspec-clients-bench"


@dataclass(frozen=True)
class ClientsRow:
    """One setting at one client count."""

    setting: str
    engine: str
    clients: int
    requests: int  # answered, all repeats
    errors: int  # failed, all repeats
    throughput: float  # completion tokens/s of all clients, median over repeats
    latency_p50: float  # seconds, request sent -> last token
    latency_p95: float
    ttft_p50: float  # seconds, request sent -> first text
    ttft_p95: float
    acceptance: float | None


@dataclass
class ClientsResult:
    """A clients bench: when and on what it ran, its setup, and its runs (the rows follow from them)."""

    date: str
    machine: dict[str, Any]
    setup: dict[str, Any]
    runs: list[LevelRun]

    def rows(self) -> list[ClientsRow]:
        """The rows, settings in the order they ran, client counts ascending."""
        order = list(dict.fromkeys(r.setting for r in self.runs))
        keys = {(r.setting, r.engine, r.clients) for r in self.runs}
        return [self._row(*key) for key in sorted(keys, key=lambda k: (order.index(k[0]), k[2]))]

    def _row(self, setting: str, engine: str, clients: int) -> ClientsRow:
        runs = [r for r in self.runs if (r.setting, r.clients) == (setting, clients)]
        replies = [x for r in runs for x in r.replies]
        ok = [x for x in replies if x.error is None]
        drafted = sum(x.drafted for x in ok)
        rates = [
            sum(x.tokens for x in r.replies if x.error is None) / r.wall if r.wall else 0.0 for r in runs
        ]
        latency, ttft = [x.latency for x in ok], [x.ttft for x in ok]
        return ClientsRow(
            setting=setting,
            engine=engine,
            clients=clients,
            requests=len(ok),
            errors=len(replies) - len(ok),
            throughput=statistics.median(rates),
            latency_p50=percentile(latency, 50),
            latency_p95=percentile(latency, 95),
            ttft_p50=percentile(ttft, 50),
            ttft_p95=percentile(ttft, 95),
            acceptance=sum(x.accepted for x in ok) / drafted if drafted else None,
        )

    def as_dict(self) -> dict[str, Any]:
        """The result file's content: the rows for readers, the runs they are worked out from."""
        return {
            "kind": KIND,
            "date": self.date,
            "cpu": self.machine.get("cpu"),
            "machine": self.machine,
            "setup": self.setup,
            "rows": [asdict(r) for r in self.rows()],
            "runs": [r.as_dict() for r in self.runs],
        }


def new_result(setup: dict[str, Any], runs: list[LevelRun], threads: int) -> ClientsResult:
    """A result dated now (UTC) on this machine."""
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return ClientsResult(date=date, machine=machine_info(threads), setup=setup, runs=runs)


def percentile(values: list[float], p: int) -> float:
    """The ``p``-th percentile (inclusive method; NaN for no values)."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def is_clients_file(data: Any) -> bool:
    """Whether a read JSON document is a clients bench's result file."""
    return isinstance(data, dict) and data.get("kind") == KIND


def read_result(data: dict[str, Any], where: str) -> ClientsResult:
    """A result file's document read back.

    Raises:
        BenchError: a field is missing or malformed (naming the file).
    """
    try:
        runs = [LevelRun.from_dict(r) for r in data["runs"]]
        return ClientsResult(str(data["date"]), dict(data.get("machine") or {}), dict(data["setup"]), runs)
    except (KeyError, TypeError, ValueError) as exc:
        raise BenchError(
            f"{where} is not a readable clients bench result ({type(exc).__name__}: {exc})",
            hint="give the clients.json a `localspec bench --clients` run wrote",
        ) from None


def write_result(result: ClientsResult, out: Path) -> dict[str, Path]:
    """``clients.json``, ``clients.md`` and ``clients.png`` in ``out``; returns their paths by kind."""
    files = {"json": out / "clients.json", "markdown": out / "clients.md", "png": out / "clients.png"}
    files["json"].write_text(json.dumps(result.as_dict(), indent=1), encoding="utf-8")
    files["markdown"].write_text(markdown(result) + "\n", encoding="utf-8")
    write_png(result.rows(), files["png"])
    return files


def markdown(result: ClientsResult) -> str:
    """The result as a markdown table, under a line saying when, on what and with which requests."""
    s, m = result.setup, result.machine
    head = (
        f"{result.date}, {m.get('cpu')}, {s.get('threads')} threads; {s.get('requests')} streamed requests "
        f"of at most {s.get('max_tokens')} tokens per level, greedy, {s.get('repeats')} repeat(s)\n\n"
        "| setting | clients | requests | tokens/s (all clients) | latency p50 / p95 (s) | "
        "first token p50 / p95 (s) | acceptance |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in result.rows():
        acc = f"{r.acceptance:.0%}" if r.acceptance is not None else "-"
        err = f" ({r.errors} failed)" if r.errors else ""
        lines.append(
            f"| {r.setting} | {r.clients} | {r.requests}{err} | {r.throughput:.1f} | "
            f"{r.latency_p50:.2f} / {r.latency_p95:.2f} | {r.ttft_p50:.2f} / {r.ttft_p95:.2f} | {acc} |"
        )
    return "\n".join(lines)


_COLOURS = [(52, 101, 164), (115, 210, 22), (245, 121, 0), (117, 80, 123), (193, 125, 17), (204, 0, 0)]
_PANELS = [("throughput", "tokens/s, all clients together"), ("latency_p50", "latency p50 (s)")]


def write_png(rows: list[ClientsRow], path: Path) -> None:
    """Two panels against clients: throughput and p50 latency, a line per setting, a legend below."""
    from PIL import Image, ImageDraw, ImageFont

    settings = list(dict.fromkeys(r.setting for r in rows))
    clients = sorted({r.clients for r in rows})
    font = ImageFont.load_default()
    panel_w, panel_h, pad = 470, 300, 55
    img = Image.new("RGB", (2 * panel_w + 40, panel_h + 2 * pad + 18 * len(settings) + 10), "white")
    draw = ImageDraw.Draw(img)
    for p, (key, title) in enumerate(_PANELS):
        x0, y0, w, h = 20 + p * (panel_w + 10) + pad, pad, panel_w - pad - 10, panel_h - 20
        values = [getattr(r, key) for r in rows if getattr(r, key) == getattr(r, key)]  # NaN left out
        vmax = (max(values, default=1.0) * 1.1) or 1.0
        draw.text((x0 - pad + 10, 15), title, fill="black", font=font)
        draw.rectangle([x0, y0, x0 + w, y0 + h], outline=(160, 160, 160))
        for i in range(5):
            y = y0 + h - h * i / 4
            draw.text((x0 - 45, y - 7), f"{vmax * i / 4:.1f}", fill="black", font=font)
        x_of = {c: x0 + w * (i + 0.5) / len(clients) for i, c in enumerate(clients)}
        for c, x in x_of.items():
            draw.text((x - 4, y0 + h + 5), str(c), fill="black", font=font)
        draw.text((x0 + w / 2 - 20, y0 + h + 22), "clients", fill="black", font=font)
        for k, setting in enumerate(settings):
            pts = [
                (x_of[r.clients], y0 + h - h * getattr(r, key) / vmax)
                for r in rows
                if r.setting == setting and getattr(r, key) == getattr(r, key)
            ]
            colour = _COLOURS[k % len(_COLOURS)]
            if len(pts) > 1:
                draw.line(pts, fill=colour, width=2)
            for x, y in pts:
                draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
    for k, setting in enumerate(settings):
        y = panel_h + 2 * pad - 10 + 18 * k
        draw.rectangle([30, y + 3, 44, y + 12], fill=_COLOURS[k % len(_COLOURS)])
        draw.text((52, y), setting, fill="black", font=font)
    img.save(path)
