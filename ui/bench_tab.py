"""The Bench tab: run localspec's workload benchmark on the chosen pair, show its table and chart."""

from __future__ import annotations

from typing import Any

import gradio as gr


def build_bench_tab(app: Any) -> None:
    gr.Markdown("The benchmark is not available in this build yet.")
