"""The localspec web page: pick a pair, run it with the draft's tokens highlighted, compare, bench.

``build_app()`` returns the Gradio Blocks; ``launch()`` serves it on localhost. Every handler
catches localspec's own errors and shows them in the page, so a bad path or an incompatible
pair never ends the server. Presentation only: the work is done by ``localspec.load`` and
the pipeline's ``stream``/``chat_stream``/``compare``.

The page's modules: ``app`` (this one) lays the page out and wires its events (:class:`App`), and serves it;
``controls`` reads and checks the Generate tab's controls (the pair, the settings, Max tokens);
``generate`` runs the pair (Run, Compare, Stop); ``layout`` builds the Generate tab's controls;
``bench_tab`` the Bench tab; ``render`` the HTML; ``pairs`` presets and scans; ``session`` the loaded
pipeline; ``common`` what they share.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr

from localspec import constants

from . import pairs
from .bench_tab import build_bench_tab
from .controls import (
    DRAFT_CONTROL_KEYS,
    FIXED_SLIDERS,
    PAIR_KEYS,
    DraftControls,
    load_pipeline,
)
from .generate import Runs
from .layout import PairBoxes, RunButtons, generate_tab
from .render import CSS, tokens_html

if TYPE_CHECKING:
    from localspec.pipeline.pipeline import Pipeline

INTRO = (
    "## localspec: speculative decoding on your own machine\n"
    "A small draft (a model, or text seen before: the prompt, earlier requests, your files) proposes "
    "tokens, the target checks them in one pass; the text stays exactly "
    "the target's. Pick a pair, run a prompt, then **Compare** to see what it buys and what it costs."
)


#: Every handler taking the sliders checks each value itself (bounded_int, bounded_float: the setting and its
#: range named), so Gradio's own check, which refuses a value out of a slider's range before any handler with
#: "Value 9000 is greater than maximum value 8192." (no setting, no next step), is left out:
#: preprocess=False hands them the values as sent.
_RAW: dict[str, Any] = {"preprocess": False}


class App(Runs):
    """The page: its controls (:class:`~localspec.ui.controls.Controls`), its runs
    (:class:`~localspec.ui.generate.Runs`) and the Bench tab, laid out and wired by :meth:`build`."""

    def build(self) -> gr.Blocks:
        found = pairs.list_presets()
        preset_choices = pairs.preset_choices(found)
        default_preset = opening_preset([p.name for p in found], self.preset)
        # the preset the page opens with sets the Settings too, as picking it does (it opened with the
        # controls' own defaults: p_min 0.75 where the embedded pair's preset says 0.3)
        settings0 = self.preset_settings(default_preset) or DraftControls()
        c: dict[str, Any] = {}
        self.c = c
        with gr.Blocks(title="localspec", analytics_enabled=False) as demo:
            gr.Markdown(INTRO)
            with gr.Tab("Generate"):
                pair, buttons = generate_tab(
                    c,
                    preset_choices=preset_choices,
                    default_preset=default_preset,
                    settings0=settings0,
                    n_threads=self.n_threads,
                    gpu=self.gpu,
                    rpc=self.rpc,
                )
            with gr.Tab("Bench"):
                bench = build_bench_tab(self)
                self.on_bench = bench[2]
            self._wire_max_tokens_and_notes(demo)
            self._wire_pair(pair, buttons)
            self._wire_runs(buttons, bench)
            demo.unload(self.on_unload)
        demo.queue(default_concurrency_limit=1)
        return demo

    def _wire_max_tokens_and_notes(self, demo: gr.Blocks) -> None:
        """Max tokens' top follows the chosen pair when it is the loaded one; a typed value out of any
        slider's range gets a note (the browser's slider moves it into range without a word). These take
        milliseconds: no spinner flashing over the slider and the note at each change."""
        c = self.c
        mt = c["max_tokens"]
        pair_inputs = {c[k] for k in PAIR_KEYS} | {mt}
        quick: dict[str, Any] = {
            "queue": False,
            "show_progress": "hidden",
            "api_visibility": "private",  # the page's own plumbing, not an API
            **_RAW,
        }
        for key in ("source", "preset", "target", "draft", "ngl_t", "ngl_d"):
            c[key].change(self.on_pair_choice, pair_inputs, [mt, c["settings_note"]], **quick)
        typed = ("n_ctx", "threads", "rpc")
        for event in [e for k in typed for e in (c[k].blur, c[k].submit)]:
            event(self.on_pair_choice, pair_inputs, [mt, c["settings_note"]], **quick)
        demo.load(self.on_pair_choice, pair_inputs, [mt, c["settings_note"]], **quick)
        mt.release(self.on_max_tokens_typed, pair_inputs, [mt, c["settings_note"]], **quick)
        for key in FIXED_SLIDERS:
            c[key].release(self.on_typed(key), c[key], [c[key], c["settings_note"]], **quick)

    def _wire_pair(self, pair: PairBoxes, buttons: RunButtons) -> None:
        """The pair column: preset or own models, a preset's facts and download, a scan and its target."""
        c = self.c
        c["source"].change(
            lambda s: (gr.update(visible=s == "Preset"), gr.update(visible=s != "Preset"), ""),
            c["source"],
            [pair.preset_box, pair.own_box, pair.pair_msg],
            queue=False,
        )
        c["mode"].change(lambda m: gr.update(visible=m == "Chat"), c["mode"], buttons.clear_btn, queue=False)
        c["preset"].change(
            self.on_preset,
            c["preset"],
            [pair.preset_md, *(c[key] for key in DRAFT_CONTROL_KEYS)],
        )
        pair.dl_btn.click(
            self.on_download,
            c["preset"],
            [pair.pair_msg, pair.preset_md, c["preset"]],
            concurrency_limit=1,
            concurrency_id="download",
        )
        pair.scan_btn.click(
            self.on_scan,
            pair.folders,
            [pair.pair_msg, c["target"], c["draft"], pair.cand_md],
            concurrency_limit=1,
            concurrency_id="scan",
        )
        c["target"].change(
            self.on_target,
            c["target"],
            [pair.pair_msg, c["draft"], pair.cand_md],
            concurrency_limit=1,
            concurrency_id="scan",
        )

    def _wire_runs(self, buttons: RunButtons, bench: Any) -> None:
        """Run, Compare and the bench on the one engine, one at a time; Stop and Clear chat."""
        c = self.c
        inputs = {v for k, v in c.items() if k not in ("output", "result", "error", "settings_note")}
        outputs = [c["output"], c["result"], c["error"], c["chat"], c["max_tokens"], c["settings_note"]]
        outputs.append(c["prompt"])  # cleared once a chat message was answered
        busy = [c["output"], c["result"], c["error"]]  # the spinner: not on the slider nor the note
        engine: dict[str, Any] = {
            "concurrency_limit": 1,
            "concurrency_id": "engine",
            "show_progress_on": busy,
            **_RAW,
        }
        # each click is counted as it happens (unqueued), so that a Stop while it waits cancels it
        queued: list[tuple[Any, Callable[..., Any]]] = [
            (buttons.run_btn.click, self.on_run),
            (c["prompt"].submit, self.on_run),
            (buttons.cmp_btn.click, self.on_compare),
        ]
        for listen, fn in queued:
            listen(self.on_request, None, None, queue=False)
            listen(fn, inputs, outputs, **engine)
        buttons.stop_btn.click(self.on_stop, None, None, queue=False)
        if bench is not None:
            button, bench_stop, fn, bench_outputs = bench
            button.click(self.on_request, None, None, queue=False)
            button.click(fn, inputs, bench_outputs, concurrency_limit=1, concurrency_id="engine", **_RAW)
            bench_stop.click(self.on_stop, None, None, queue=False)
        buttons.clear_btn.click(
            lambda: ([], tokens_html([]), ""), None, [c["chat"], c["output"], c["error"]], queue=False
        )


def opening_preset(names: list[str], asked: str | None) -> str | None:
    """The preset the page opens on: ``asked`` (``localspec ui --preset``), else the one last downloaded or
    run from the command line, else the embedded pair, else the first one.

    Args:
        names: every preset that loads.
        asked: the preset asked for (checked to exist before the page is built), or None.

    Returns:
        The name, or None when there is no preset at all.
    """
    from localspec.hub.recent import last_preset

    for name in (asked, last_preset(), constants.EMBEDDED_PRESET):
        if name is not None and name in names:
            return name
    return names[0] if names else None


def theme() -> Any:
    """The default theme with system fonts, so nothing is fetched from a font CDN (works offline)."""
    return gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])


def build_app(
    loader: Callable[..., Pipeline] = load_pipeline,
    *,
    n_threads: int | None = None,
    rpc: str | None = None,
    preset: str | None = None,
) -> gr.Blocks:
    """The page (see :meth:`App.build`); ``preset``: the one it opens on (:func:`opening_preset`)."""
    return App(loader, n_threads=n_threads, rpc=rpc, preset=preset).build()


def launch(
    host: str = "127.0.0.1",
    port: int = 7860,
    share: bool = False,
    *,
    auth: tuple[str, str] | None = None,
    open_browser: bool = False,
    block: bool = True,
    n_threads: int | None = None,
    rpc: str | None = None,
    preset: str | None = None,
) -> Any:
    """Serve the page; ``block=False`` returns at once (the server runs in a thread). Who may reach it is
    decided before (``localspec.serve.exposure``, in ``localspec ui``); ``auth`` is the login Gradio asks for,
    ``open_browser`` opens the default browser on the page once it is up; ``n_threads``: what every pair
    loads with (None: the library's default); ``rpc``: what the page's RPC servers box starts with;
    ``preset``: the preset the page opens on (None: :func:`opening_preset` picks)."""
    demo = build_app(n_threads=n_threads, rpc=rpc, preset=preset)
    return demo.launch(
        server_name=host,
        server_port=port,
        share=share,
        auth=auth,
        inbrowser=open_browser,
        prevent_thread_lock=not block,
        theme=theme(),
        css=CSS,
        show_error=False,
        footer_links=["settings"],
        ssr_mode=False,
        # the command line says where the page is; Gradio's lines add API advice ("set share=True in
        # launch()"), except the public link a share prints, which only Gradio knows
        quiet=not share,
    )
