"""The Bench tab: run localspec's workload benchmark on the chosen pair, show its table and chart.

The benchmark itself is ``localspec.bench.single.benchmark``; its report files come from
``localspec.bench.report``, the
workload names from ``localspec.bench.workloads`` and the strategy names from ``localspec.settings``.
The tab only maps the page's choices onto those calls and counts progress lines for the bar.
"""

from __future__ import annotations

import html
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr

from localspec.bench import report
from localspec.bench import single as bench
from localspec.bench.workloads import WORKLOADS, load_workloads
from localspec.errors import LocalspecError
from localspec.settings import SPECULATIVE_STRATEGIES

from .common import (
    BENCH_LIMIT_RANGE,
    BENCH_MAX_TOKENS_RANGE,
    BENCH_REPEATS_RANGE,
    bounded_int,
    friendly,
    log,
    session_key,
)
from .render import ok_html


def expected_runs(workloads: list[Any], n_configs: int, repeats: int) -> int:
    """How many counted runs the benchmark reports: every prompt under the baseline and each config."""
    return max(1, sum(len(w.prompts) for w in workloads) * (1 + n_configs) * max(1, repeats))


class BenchStopped(LocalspecError):
    """The page's Stop ended the benchmark between two runs."""


def run_bench(
    app: Any, v: dict[str, Any], progress: Any, session: str = ""
) -> tuple[str, str, str | None, str | None]:
    """Run the benchmark for the pair chosen in the Generate tab; returns (message, table md, png, json).

    ``session``'s Stop ends it after the run in progress (:class:`BenchStopped`; the benchmark closes
    its pipeline on the way out, as on any error)."""
    c = app.c
    spec = app.spec(v)
    names = list(v[c["bench_workloads"]] or []) or None
    limit = bounded_int(v[c["bench_limit"]] or 0, BENCH_LIMIT_RANGE, "Prompts per workload") or None
    repeats = bounded_int(v[c["bench_repeats"]], BENCH_REPEATS_RANGE, "Repeats")
    max_tokens = bounded_int(v[c["bench_max_tokens"]], BENCH_MAX_TOKENS_RANGE, "Max tokens per run")
    strategies = list(v[c["bench_strategies"]] or []) or None
    workloads = load_workloads(names, None, limit)
    total = expected_runs(workloads, len(strategies) if strategies else 2, repeats)  # default: model, ngram
    done = [0]
    kwargs: dict[str, Any] = (
        {"preset": spec.preset} if spec.preset else {"target": spec.target, "draft": spec.draft}
    )
    if spec.rpc:  # the Load options' RPC servers, as for a run
        kwargs["rpc"] = spec.rpc
    progress(0.0, desc="loading the pair")
    with app.holder.busy(), app.holder.stoppable(session) as stop:  # stop: this session's Stop

        def tick(message: str) -> None:
            if stop.is_set():
                raise BenchStopped(
                    f"the benchmark was stopped after {done[0]} of {total} runs; nothing was written",
                    hint="press Run bench again for a whole report (fewer prompts or tokens make it shorter)",
                )
            if ":" in message and " tok/s" in message:  # one counted run finished
                done[0] += 1
            try:
                progress((min(done[0], total), total), desc=message[:80], unit="runs")
            except Exception:  # progress display is best effort
                pass

        app.holder.close()  # the bench loads its own pipeline: one pair in memory at a time
        result = bench.benchmark(
            **kwargs,
            workloads=names,
            limit=limit,
            max_tokens=max_tokens,
            temperature=0.0,
            repeats=repeats,
            n_ctx=spec.n_ctx,
            strategies=strategies,
            progress=tick,
        )
    out = Path(tempfile.mkdtemp(prefix="localspec-bench-"))
    files = report.write_all(result, out)
    table = files["markdown"].read_text(encoding="utf-8")
    msg = ok_html(f"benchmark done: {done[0]} runs; files in {out}")
    for line in report.noise_lines(result):  # above the table, not only in its summary
        msg += f'<div class="ls-caution" id="ls-bench-caution">{html.escape(line)}</div>'
    return msg, table, str(files["png"]), str(files["json"])


def build_bench_tab(app: Any) -> tuple[Any, Any, Any, list[Any]]:
    """Controls, Run bench and Stop buttons, the report table (Markdown), its chart (PNG), the JSON file.

    Returns (button, stop button, handler, outputs) for the caller to wire once all inputs exist (the
    pair is picked in the Generate tab)."""
    c = app.c
    gr.Markdown(
        "Runs the target alone and each strategy **interleaved on the same prompts** in this process, "
        "for the pair picked in the Generate tab, and reports acceptance, tokens/s, speedup (median over "
        "prompts), the theoretical ceiling and the draft's memory cost. Same as `localspec bench`; the "
        "loaded pair is closed while it runs. **Stop** ends it after the run in progress."
    )
    with gr.Row():
        c["bench_workloads"] = gr.CheckboxGroup(
            list(WORKLOADS), value=["code"], label="Workloads", elem_id="ls-bench-workloads"
        )
        c["bench_strategies"] = gr.CheckboxGroup(
            list(SPECULATIVE_STRATEGIES), value=[], label="Strategies (none ticked: the pair's defaults)"
        )
    with gr.Row():
        c["bench_limit"] = gr.Number(2, label="Prompts per workload (0 = all)", precision=0)
        c["bench_max_tokens"] = gr.Number(
            64, label=f"Max tokens per run (up to {BENCH_MAX_TOKENS_RANGE[1]})", precision=0
        )
        c["bench_repeats"] = gr.Number(1, label=f"Repeats (up to {BENCH_REPEATS_RANGE[1]})", precision=0)
    with gr.Row():
        bench_btn = gr.Button("Run bench", variant="primary", elem_id="ls-bench-run")
        stop_btn = gr.Button("Stop", variant="stop", elem_id="ls-bench-stop")
    msg = gr.HTML("", elem_id="ls-bench-msg")
    table = gr.Markdown("", elem_id="ls-bench-table")
    with gr.Row():
        chart = gr.Image(label="Speedup per workload", type="filepath", elem_id="ls-bench-chart", height=320)
        report_file = gr.File(label="bench.json")

    def on_bench(v: dict[str, Any], request: gr.Request, progress: gr.Progress = gr.Progress()):  # noqa: B008
        session = session_key(request)
        try:
            if not app.holder.claim(session):
                raise BenchStopped("stopped before it started", hint="press Run bench to start it")
            return run_bench(app, v, progress, session)
        except BenchStopped as exc:  # asked for: said plainly, not as a failure
            # also in the terminal running `localspec ui`: a closed or reloaded page never shows it
            log.warning("%s", exc.message)
            return ok_html(f"{exc.message} ({exc.hint})"), "", None, None
        except Exception as exc:  # every failure becomes a message in the page
            return friendly(exc), "", None, None

    return bench_btn, stop_btn, on_bench, [msg, table, chart, report_file]
