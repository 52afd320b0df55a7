"""The Generate tab's layout: its controls (kept by key in the page's ``c``) and the buttons it wires."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from localspec import constants
from localspec.settings import N_MAX_RANGE, P_MIN_RANGE, max_threads

from . import pairs
from .common import GPU_LAYERS_RANGE, MAX_TOKENS_RANGE, N_CTX_RANGE, TEMPERATURE_RANGE
from .controls import FORMAT_CHOICES, STRATEGY_CHOICES, DraftControls
from .render import empty_panel_html, legend_html, tokens_html


@dataclass
class PairBoxes:
    """The pair column's parts that are not values of a run: its boxes, buttons and messages."""

    preset_box: Any
    own_box: Any
    preset_md: Any
    dl_btn: Any
    folders: Any
    scan_btn: Any
    cand_md: Any
    pair_msg: Any


@dataclass
class RunButtons:
    """The run column's buttons."""

    run_btn: Any
    cmp_btn: Any
    stop_btn: Any
    clear_btn: Any


def generate_tab(
    c: dict[str, Any],
    *,
    preset_choices: Any,
    default_preset: str | None,
    settings0: DraftControls,
    n_threads: int | None,
    gpu: bool,
    rpc: str | None = None,
) -> tuple[PairBoxes, RunButtons]:
    """The Generate tab's controls, built inside the tab: the pair on the left, the run on the right (its
    Settings start as ``settings0``, the default preset's), the numbers panel below."""
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=320):
            pair = _pair_column(c, preset_choices, default_preset, n_threads=n_threads, gpu=gpu, rpc=rpc)
        with gr.Column(scale=2, min_width=480):
            buttons = _run_column(c, settings0)
    gr.Markdown("### 3. Speed next to memory")
    c["result"] = gr.HTML(empty_panel_html(), elem_id="ls-result-box")
    c["chat"] = gr.State([])
    return pair, buttons


def _pair_column(
    c: dict[str, Any],
    preset_choices: Any,
    default_preset: str | None,
    *,
    n_threads: int | None,
    gpu: bool,
    rpc: str | None,
) -> PairBoxes:
    gr.Markdown("### 1. Pair")
    c["source"] = gr.Radio(["Preset", "My models"], value="Preset", show_label=False, elem_id="ls-source")
    with gr.Group(visible=True) as preset_box:
        c["preset"] = gr.Dropdown(preset_choices, value=default_preset, label="Preset", elem_id="ls-preset")
        preset_md = gr.HTML(pairs.preset_info_html(default_preset), elem_id="ls-preset-info")
        dl_btn = gr.Button("Download", size="sm", elem_id="ls-download")
    with gr.Group(visible=False) as own_box:
        folders = gr.Textbox(
            label="Folders to scan",
            placeholder="empty: the usual places (HF cache, LM Studio, Ollama, LOCALSPEC_MODELS)",
            lines=1,
            elem_id="ls-folders",
        )
        scan_btn = gr.Button("Scan", size="sm", elem_id="ls-scan")
        c["target"] = gr.Dropdown(
            [],
            label="Target (pick, or type a .gguf path)",
            allow_custom_value=True,
            elem_id="ls-target",
        )
        c["draft"] = gr.Dropdown([], label="Draft", allow_custom_value=True, elem_id="ls-draft")
        cand_md = gr.Markdown("", elem_id="ls-candidates")
    pair_msg = gr.HTML("", elem_id="ls-pair-msg")
    with gr.Accordion("Load options", open=False, elem_id="ls-load-options"):
        c["n_ctx"] = gr.Number(
            0,
            label=f"Context (tokens, {N_CTX_RANGE[0]}-{N_CTX_RANGE[1]}; 0 = the "
            f"preset's, else {constants.DEFAULT_N_CTX})",
            precision=0,
            elem_id="ls-n-ctx",
        )
        default_threads = n_threads or constants.default_threads()
        c["threads"] = gr.Number(
            0,
            label=f"CPU threads (1-{max_threads()}; 0 = {default_threads}: "
            + ("what --threads says)" if n_threads else "the physical cores)"),
            precision=0,
            elem_id="ls-threads",
        )
        c["rpc"] = gr.Textbox(
            rpc or "",
            label="RPC servers (HOST:PORT,... running `localspec rpc-server`; the target's layers go there, "
            "the draft stays here; empty: this machine only)",
            placeholder="e.g. 192.168.1.20:50052",
            lines=1,
            elem_id="ls-rpc",
        )
        c["ngl_t"] = gr.Slider(*GPU_LAYERS_RANGE, 0, step=1, label="Target n_gpu_layers", visible=gpu)
        c["ngl_d"] = gr.Slider(*GPU_LAYERS_RANGE, 0, step=1, label="Draft n_gpu_layers", visible=gpu)
    return PairBoxes(preset_box, own_box, preset_md, dl_btn, folders, scan_btn, cand_md, pair_msg)


def _run_column(c: dict[str, Any], settings0: DraftControls) -> RunButtons:
    gr.Markdown("### 2. Run")
    c["mode"] = gr.Radio(["Prompt", "Chat"], value="Prompt", show_label=False, elem_id="ls-mode")
    c["prompt"] = gr.Textbox(label="Prompt", lines=4, elem_id="ls-prompt", value="def fibonacci(n):")
    with gr.Row():
        run_btn = gr.Button("Run", variant="primary", elem_id="ls-run")
        cmp_btn = gr.Button("Compare", elem_id="ls-compare")
        stop_btn = gr.Button("Stop", variant="stop", elem_id="ls-stop")
        clear_btn = gr.Button("Clear chat", elem_id="ls-clear", visible=False)
    with gr.Accordion("Settings", open=False, elem_id="ls-settings"):
        with gr.Row():
            c["max_tokens"] = gr.Slider(
                *MAX_TOKENS_RANGE,
                128,
                step=1,
                label="Max tokens",
                elem_id="ls-max-tokens",
            )
            c["temperature"] = gr.Slider(*TEMPERATURE_RANGE, 0, step=0.05, label="Temperature")
        with gr.Row():
            c["n_max"] = gr.Slider(
                *N_MAX_RANGE,
                settings0.n_max,
                step=1,
                label="Draft length n_max",
                elem_id="ls-n-max",
            )
            c["p_min"] = gr.Slider(*P_MIN_RANGE, settings0.p_min, step=0.01, label="p_min (draft confidence)")
        with gr.Row():
            c["adaptive"] = gr.Checkbox(settings0.adaptive, label="Adaptive draft length")
            c["strategy"] = gr.Radio(
                STRATEGY_CHOICES,
                value=settings0.strategy,
                label="Strategy",
                elem_id="ls-strategy",
            )
        with gr.Row():
            c["format"] = gr.Radio(
                FORMAT_CHOICES,
                value="Text",
                label="Output (JSON: a grammar keeps every token valid JSON)",
                elem_id="ls-format",
            )
            c["schema"] = gr.Textbox(
                label="JSON schema (for the JSON schema output)",
                lines=2,
                elem_id="ls-schema",
                placeholder='{"type": "object", "properties": {...}}',
            )
    # outside the (closed) accordion: a Max tokens lowered on Run is seen
    c["settings_note"] = gr.HTML("", elem_id="ls-settings-note", visible=False)
    c["error"] = gr.HTML("", elem_id="ls-error-box")
    c["output"] = gr.HTML(tokens_html([]), elem_id="ls-output-box")
    gr.HTML(legend_html())
    return RunButtons(run_btn, cmp_btn, stop_btn, clear_btn)
