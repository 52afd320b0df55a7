"""The localspec web page: pick a pair, run it with the draft's tokens highlighted, compare, bench.

``build_app()`` returns the Gradio Blocks; ``launch()`` serves it on localhost. Every handler
catches localspec's own errors and shows them in the page, so a bad path or an incompatible
pair never ends the server. Presentation only: the work is done by ``localspec.load`` and
the pipeline's ``stream``/``chat_stream``/``compare``.
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr

from localspec import constants
from localspec.bench.report import NOISE_MARGIN
from localspec.constrain.grammar import Grammar
from localspec.errors import LocalspecError, ModelNotFoundError, SettingsError
from localspec.gguf.meta import read_metadata
from localspec.hub import presets
from localspec.pipeline.chat_turns import chat_messages
from localspec.settings import N_MAX_RANGE, P_MIN_RANGE, STRATEGIES, max_threads

from . import pairs
from .bench_tab import build_bench_tab
from .common import (
    GPU_LAYERS_RANGE,
    MAX_TOKENS_RANGE,
    N_CTX_RANGE,
    TEMPERATURE_RANGE,
    Room,
    bounded_float,
    bounded_int,
    check_max_tokens,
    check_n_ctx,
    clamped,
    friendly,
    lowered_note,
    max_tokens_range,
    note_update,
    progress_adapter,
    session_key,
    typed_note,
)
from .render import (
    CSS,
    chat_prefix_html,
    empty_panel_html,
    error_html,
    legend_html,
    ok_html,
    result_panel_html,
    tokens_html,
)
from .session import PairSpec, PipelineHolder

PAIR_DEFAULT = "pair default"
#: The Strategy radio: the pair's (or preset's) own strategy, or one of localspec's.
STRATEGY_CHOICES = [PAIR_DEFAULT, *STRATEGIES]
#: The Output setting: free text, any JSON object, or JSON matching a schema typed in the page.
FORMAT_CHOICES = ["Text", "JSON", "JSON schema"]
INTRO = (
    "## localspec: speculative decoding on your own machine\n"
    "A small draft (a model, or text seen before: the prompt, earlier requests, your files) proposes "
    "tokens, the target checks them in one pass; the text stays exactly "
    "the target's. Pick a pair, run a prompt, then **Compare** to see what it buys and what it costs."
)
REFRESH_SECONDS = 0.08  # how often the streaming output is pushed to the page
#: The controls that decide which pair is loaded (what :meth:`App.spec` reads).
PAIR_KEYS = ("source", "preset", "target", "draft", "n_ctx", "threads", "ngl_t", "ngl_d")
#: The sliders with a fixed range: (label, bounds, check), as the handlers check them.
FIXED_SLIDERS: dict[str, tuple[str, tuple[Any, Any], Callable[..., Any]]] = {
    "temperature": ("Temperature", TEMPERATURE_RANGE, bounded_float),
    "n_max": ("Draft length n_max", N_MAX_RANGE, bounded_int),
    "p_min": ("p_min", P_MIN_RANGE, bounded_float),
    "ngl_t": ("Target n_gpu_layers", GPU_LAYERS_RANGE, bounded_int),
    "ngl_d": ("Draft n_gpu_layers", GPU_LAYERS_RANGE, bounded_int),
}


def gpu_offload_available() -> bool:
    """True when the installed llama.cpp build can offload layers to a GPU (decides if the sliders show)."""
    try:
        import llama_cpp

        return bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:  # no llama_cpp, or a build without the symbol
        return False


def _load(**kwargs: Any) -> Any:
    import localspec

    return localspec.load(**kwargs)


def trained_context(path: str) -> int | None:
    """The context length a local GGUF was trained for, from its header; None when not readable here
    (not a regular file, not a GGUF: loading reports that properly)."""
    try:
        if not Path(path).is_file():
            return None
        meta = read_metadata(path, tensors=False, merges=False)
        value = meta.get(f"{meta.architecture}.context_length")
        return int(value) if isinstance(value, int) and value > 0 else None
    except (LocalspecError, OSError):
        return None


def check_slider(key: str, value: Any) -> Any:
    """``value`` of the fixed-range slider ``key`` (:data:`FIXED_SLIDERS`), checked: a SettingsError names the
    setting and its range."""
    label, bounds, check = FIXED_SLIDERS[key]
    return check(value, bounds, label)


def _same_text_note(cmp: Any, opts: dict[str, Any]) -> str:
    """Compare's word on the two texts. Sampling draws differ by design; at temperature 0 the texts part
    only at a near-tie, where llama.cpp's batched verify pass rounds differently from a one-token pass
    (every token is still the verifying pass's own best: README, "The honest part first")."""
    if getattr(cmp, "same_text", True):
        return "yes"
    if opts.get("temperature", 0.0) > 0:
        return "no (sampling: each run draws its own text from the same distribution)"
    return (
        "no: they part at a near-tie, where the batched verify pass rounds differently "
        "(each token is still the target's own best)"
    )


def noise_caution(cmp: Any) -> str:
    """A warning for a Compare figure no drafting can produce (one timing of each side, taken while
    something else ran): a speedup past the tokens each target pass yielded, or far from 1x with no draft
    accepted; "" when the figure is possible. The same margin as the benchmark's noise warnings."""
    spec = cmp.speculative.stats
    per_pass = spec.tokens_per_round
    if not spec.accepted and abs(cmp.speedup - 1) > NOISE_MARGIN:
        why = f"{cmp.speedup:.2f}x with no draft accepted is the target alone timed twice"
    elif per_pass and cmp.speedup > per_pass * (1 + NOISE_MARGIN):
        why = f"{cmp.speedup:.2f}x is more than the {per_pass:.2f} tokens each target pass gave"
    else:
        return ""
    return (
        f"Caution: {why}, so the machine was busy during one of the runs; press Compare again "
        "when it is idle (the Bench tab repeats and takes medians)."
    )


class App:
    """The page's state: one PipelineHolder and the last scan, shared by every browser tab (a Stop is per
    browser session)."""

    def __init__(self, loader: Callable[..., Any] = _load, *, n_threads: int | None = None) -> None:
        self.holder = PipelineHolder(loader)
        self.n_threads = n_threads  # every pair loads with these (`localspec ui --threads`)
        self.view = pairs.ScanView({})
        self.gpu = gpu_offload_available()
        #: the pair the engine last loaded for a run, and what its context leaves for an answer
        self.loaded_room: tuple[PairSpec, Room] | None = None

    # -- pair selection ------------------------------------------------------------------------

    def spec(self, v: dict[str, Any]) -> PairSpec:
        c = self.c
        ngl_t = ngl_d = 0
        if self.gpu:
            ngl_t = check_slider("ngl_t", v[c["ngl_t"]] or 0)
            ngl_d = check_slider("ngl_d", v[c["ngl_d"]] or 0)
        n_ctx_value = v[c["n_ctx"]] or 0
        threads = bounded_int(v[c["threads"]] or 0, (0, max_threads()), "CPU threads") or self.n_threads
        if v[c["source"]] == "Preset":
            name = v[c["preset"]] or constants.EMBEDDED_PRESET
            return PairSpec(
                preset=name,
                n_ctx=check_n_ctx(n_ctx_value),
                n_gpu_layers=ngl_t,
                draft_n_gpu_layers=ngl_d,
                n_threads=threads,
            )
        target = (v[c["target"]] or "").strip()
        if not target:
            raise ModelNotFoundError(
                "no target model chosen",
                hint="press Scan and pick a target, or type the path of a .gguf file",
            )
        n_ctx = check_n_ctx(n_ctx_value)
        if n_ctx:  # a size the user typed: not above what the model was trained for
            n_ctx = check_n_ctx(n_ctx, trained_context(target))
        draft = (v[c["draft"]] or "").strip() or None
        return PairSpec(
            target=target,
            draft=draft,
            n_ctx=n_ctx,
            n_gpu_layers=ngl_t,
            draft_n_gpu_layers=ngl_d,
            n_threads=threads,
        )

    def gen_opts(self, v: dict[str, Any]) -> dict[str, Any]:
        c = self.c
        strategy = v[c["strategy"]]
        if strategy not in STRATEGY_CHOICES:
            raise LocalspecError(
                f"strategy {strategy!r} is not one of {', '.join(STRATEGY_CHOICES)}", hint="pick one"
            )
        opts: dict[str, Any] = {
            "max_tokens": check_max_tokens(v[c["max_tokens"]], self.room_for(v)),
            "temperature": check_slider("temperature", v[c["temperature"]]),
            "n_max": check_slider("n_max", v[c["n_max"]]),
            "p_min": check_slider("p_min", v[c["p_min"]]),
            "adaptive": bool(v[c["adaptive"]]),
            "strategy": None if strategy == PAIR_DEFAULT else strategy,
        }
        grammar = output_grammar(v[c["format"]], v[c["schema"]])
        if grammar is not None:
            opts["grammar"] = grammar
        return opts

    # -- Max tokens and the loaded pair ----------------------------------------------------------

    def room_for(self, v: dict[str, Any]) -> Room | None:
        """The loaded pair's :class:`Room` when the pair chosen in ``v`` is the one loaded, else None (nothing
        loaded, another pair chosen, or a choice that does not load: the run says why)."""
        loaded = self.loaded_room
        if loaded is None:
            return None
        try:
            spec = self.spec(v)
        except LocalspecError:
            return None
        return loaded[1] if spec == loaded[0] == self.holder.spec else None

    def on_pair_choice(self, v: dict[str, Any]) -> tuple[Any, Any]:
        """Another pair (or load option) chosen, or the page opened: Max tokens' top follows that pair's
        context when it is the loaded one, else :data:`MAX_TOKENS_RANGE`; a value above it is lowered, and
        the Settings note says so."""
        room = self.room_for(v)
        hi = max_tokens_range(room)[1]
        value = v[self.c["max_tokens"]]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > hi:
            return gr.update(maximum=hi, value=hi), note_update(lowered_note(value, hi, room))
        return gr.update(maximum=hi), note_update("")

    def on_max_tokens_typed(self, v: dict[str, Any]) -> tuple[Any, Any]:
        """Max tokens typed (or dragged) and left: a value out of its range gets a note naming the setting
        and the range, and the box holds the nearest end of it (Gradio's slider moves it there without a
        word); a value inside it clears the note."""
        room = self.room_for(v)
        bounds = max_tokens_range(room)
        value = v[self.c["max_tokens"]]
        try:
            n = check_max_tokens(value, room)
        except SettingsError as exc:
            now = clamped(value, bounds)
            update = gr.update(maximum=bounds[1]) if now is None else gr.update(maximum=bounds[1], value=now)
            return update, note_update(typed_note(exc, now))
        # the value as typed: the browser's slider may have moved it to a top it held from before
        return gr.update(maximum=bounds[1], value=n), note_update("")

    def on_typed(self, key: str) -> Callable[[Any], tuple[Any, Any]]:
        """The ``release`` handler of the fixed-range slider ``key`` (as :meth:`on_max_tokens_typed`)."""
        bounds = FIXED_SLIDERS[key][1]

        def handler(value: Any) -> tuple[Any, Any]:
            try:
                check_slider(key, value)
            except SettingsError as exc:
                now = clamped(value, bounds)
                update = gr.update() if now is None else gr.update(value=now)
                return update, note_update(typed_note(exc, now))
            return gr.update(), note_update("")

        return handler

    def fit_max_tokens(self, opts: dict[str, Any], prompt_tokens: int | None = None) -> dict[Any, Any]:
        """After a pair was loaded for a run: Max tokens' top becomes its context's room, and a value above it
        is lowered for this run and in the page, with a note (updates for the slider and the note). With
        ``prompt_tokens`` (this run's prompt), a value past what this prompt leaves is lowered for this
        run only, with a note: the page's top is for the shortest prompt, so it can be more."""
        c = self.c
        assert self.loaded_room is not None  # set by _pipe
        spec, room = self.loaded_room
        update: dict[Any, Any] = {c["max_tokens"]: gr.update(maximum=room.max_tokens)}
        notes = []
        if spec.n_ctx and spec.n_ctx != room.n_ctx:  # the Context asked for is not the one loaded
            why = "the model's trained context" if room.n_ctx < spec.n_ctx else "llama.cpp's steps of 256"
            notes.append(f"Context {spec.n_ctx} loaded as {room.n_ctx} tokens ({why}).")
        asked = opts["max_tokens"]
        if asked > room.max_tokens:
            opts["max_tokens"] = room.max_tokens
            update[c["max_tokens"]] = gr.update(maximum=room.max_tokens, value=room.max_tokens)
            notes.append(lowered_note(asked, room.max_tokens, room))
        left = room.n_ctx - prompt_tokens if prompt_tokens is not None else 0
        if 0 < left < opts["max_tokens"]:  # (none left at all: the engine's refusal says what to do)
            notes.append(
                f"Max tokens {opts['max_tokens']} lowered to {left} for this run: the prompt takes "
                f"{prompt_tokens} of the context's {room.n_ctx} tokens ({room.more()})."
            )
            opts["max_tokens"] = left
        if notes:
            update[c["settings_note"]] = note_update(" ".join(notes))
        return update

    @staticmethod
    def prompt_tokens(pipe: Any, prompt: str, messages: list[dict] | None) -> int | None:
        """How many tokens this run's prompt takes (a chat's as its template renders it); None when it
        cannot be told here (the run itself then says what is wrong)."""
        try:
            if messages is None:
                return len(pipe.tokenize(prompt))
            return len(pipe.format_chat(chat_messages(messages))[0])
        except Exception:
            return None

    @staticmethod
    def preset_settings(name: str | None) -> tuple[int, float, bool, str] | None:
        """A preset's draft settings as the Settings controls hold them (n_max, p_min, adaptive, strategy),
        or None when it does not load (its facts box says why): for the preset the page opens with, and
        for each one picked after."""
        try:
            d = presets.get_preset(name).draft if name else None
        except LocalspecError:
            return None
        if d is None:
            return None
        strategy = d.strategy if d.strategy in STRATEGY_CHOICES else PAIR_DEFAULT
        return d.n_max, d.p_min, d.adaptive, strategy

    def on_preset(self, name: str):
        """The preset's facts, and its draft settings (strategy included) into the Settings controls."""
        md = pairs.preset_info_html(name)
        chosen = self.preset_settings(name)
        if chosen is None:
            return md, gr.update(), gr.update(), gr.update(), gr.update()
        return (md, *(gr.update(value=x) for x in chosen))

    def on_download(self, name: str, progress: gr.Progress = gr.Progress()):  # noqa: B008
        try:
            pair = pairs.download(name, progress_adapter(progress))
        except Exception as exc:
            return friendly(exc), pairs.preset_info_html(name), gr.update()
        verdict = f", verdict {pair.verdict}" if getattr(pair, "verdict", None) else ""
        msg = ok_html(
            f"{name}: target {pair.target}" + (f", draft {pair.draft}" if pair.draft else "") + verdict
        )
        choices = pairs.preset_choices(pairs.list_presets())
        return msg, pairs.preset_info_html(name), gr.update(choices=choices, value=name)

    def on_scan(self, folders: str):
        """The models found (largest first as the target), that target's drafts and candidates table, and
        a message that says what was found, or where it looked and why nothing was."""
        try:
            self.view = pairs.scan_models(folders or "")
        except Exception as exc:
            return friendly(exc), gr.update(), gr.update(), ""
        choices = self.view.target_choices()
        if not choices:
            typed = pairs.scan_folders(folders or "")
            missing = [f for f in typed if not Path(f).expanduser().exists()]
            if missing:
                why = f"no such folder: {', '.join(missing)}"
            elif typed:
                why = "no GGUF models found there"
            else:
                where = ", ".join(str(d) for d in constants.default_scan_dirs()) or "none on this machine"
                why = f"no GGUF models in the usual places ({where})"
            hint = "type the folders that hold your .gguf files, one per line, then Scan"
            msg = error_html(LocalspecError(why, hint=hint), title="Nothing found")
            return msg, gr.update(choices=[], value=None), gr.update(choices=[], value=None), ""
        msg = ok_html(f"found {len(choices)} model(s)")
        _, drafts, table = self.on_target(choices[0][1])  # filled here: an unchanged target fires no change
        return msg, gr.update(choices=choices, value=choices[0][1]), drafts, table

    def on_target(self, target: str | None):
        """The drafts that fit ``target`` and the candidates table; the message box is left as it is
        unless something is wrong (a scan's "found N" stays)."""
        if not target:
            return gr.update(), gr.update(), ""
        try:
            info = self.view.models.get(target) or pairs.inspect_model(target)
            choices, md = pairs.draft_options(info, self.view)
        except Exception as exc:
            return friendly(exc), gr.update(choices=[], value=None), ""
        return gr.update(), gr.update(choices=choices, value=choices[0][1]), md

    # -- running -------------------------------------------------------------------------------

    def _pipe(self, v: dict[str, Any], progress: Any) -> Any:
        spec = self.spec(v)
        pipe = self.holder.get(spec, progress_adapter(progress))
        self.loaded_room = (spec, Room.of(pipe))
        return pipe

    def on_run(
        self,
        v: dict[str, Any],
        request: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008
    ) -> Iterator[dict]:
        c = self.c
        session = session_key(request)
        out, panel, err, chat = c["output"], c["result"], c["error"], c["chat"]
        prompt = v[c["prompt"]] or ""
        history = list(v[chat] or [])
        is_chat = v[c["mode"]] == "Chat"
        prefix = chat_prefix_html(history + [{"role": "user", "content": prompt}]) if is_chat else ""
        pieces: list[tuple[str, bool | str | None]] = []
        stats = None
        try:
            if not self.holder.claim(session):  # its Stop came while it waited in the queue
                yield {out: tokens_html([], prefix=prefix, status="stopped before it started")}
                return
            if not prompt.strip():
                raise LocalspecError(
                    "the prompt is empty", hint="type something to continue in the prompt box"
                )
            opts = self.gen_opts(v)  # every value checked before anything is loaded
            yield {err: "", out: tokens_html([], prefix=prefix, status="loading the pair...")}
            pipe = self._pipe(v, progress)
            messages = history + [{"role": "user", "content": prompt}] if is_chat else None
            yield self.fit_max_tokens(opts, self.prompt_tokens(pipe, prompt, messages))
            if pipe.costs_pending(opts["strategy"]):
                status = "measuring this machine's decoding costs once (20-30 s on two CPU cores; kept)..."
                yield {out: tokens_html([], prefix=prefix, status=status)}
                pipe.machine_costs()
            if messages is not None:
                conversation = messages

                def make():
                    return pipe.chat_stream(conversation, **opts)
            else:

                def make():
                    return pipe.stream(prompt, **opts)

            last = 0.0
            finish = None
            tokens = self.holder.stream(make, session=session)
            try:
                for tr in tokens:
                    pieces.append((tr.text, tr.source if tr.from_draft else None))
                    stats, finish = tr.stats, tr.finish_reason
                    if finish:
                        break  # the answer is complete: on the page before the stream is cleaned up
                    now = time.monotonic()
                    if now - last >= REFRESH_SECONDS:
                        last = now
                        yield {out: tokens_html(pieces, prefix=prefix)}
                status = "stopped" if self.holder.was_stopped(session) and finish is None else ""
                if finish == "length":  # JSON cut here is not valid JSON: say why it ends
                    status = "cut at Max tokens: raise it for the whole answer"
                update: dict[Any, Any] = {out: tokens_html(pieces, prefix=prefix, status=status)}
                if stats is not None:
                    update[panel] = result_panel_html(
                        stats, note="target-alone speed and speedup: press Compare"
                    )
                if is_chat:
                    reply = "".join(t for t, _ in pieces)
                    update[c["prompt"]] = ""  # sent: the box is for the next message, as in a chat app
                    update[chat] = history + [
                        {"role": "user", "content": prompt},
                        {"role": "assistant", "content": reply},
                    ]
                yield update
            finally:
                # the engine's cleanup (the KV cache put right, the suffix cache fed: at times a second
                # with millions of stored tokens) once the page shows the answer
                tokens.close()
        except Exception as exc:
            if isinstance(exc, LocalspecError):
                gr.Warning(html.escape(exc.message))  # Gradio renders a toast's text as HTML
            failed = {err: friendly(exc), out: tokens_html(pieces, prefix=prefix, status="failed")}
            yield failed | {panel: empty_panel_html()}  # the last run's numbers are not this one's

    def on_compare(
        self,
        v: dict[str, Any],
        request: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008
    ) -> dict:
        c = self.c
        prompt = v[c["prompt"]] or ""
        fit: dict[Any, Any] = {}
        try:
            if not self.holder.claim(session_key(request)):  # its Stop came while it waited
                return {c["output"]: tokens_html([], status="stopped before it started")}
            if not prompt.strip():
                raise LocalspecError("the prompt is empty", hint="type a prompt, then press Compare")
            opts = self.gen_opts(v)
            pipe = self._pipe(v, progress)
            fit = self.fit_max_tokens(opts, self.prompt_tokens(pipe, prompt, None))
            progress(None, desc="target alone, then with the draft")
            with self.holder.busy():
                cmp = pipe.compare(prompt, **opts)
            spec = cmp.speculative.stats
            panel = result_panel_html(
                spec,
                baseline=cmp.baseline.stats,
                speedup=cmp.speedup,
                memory=getattr(pipe, "memory", None) or spec.memory,
                note="same text with and without the draft: " + _same_text_note(cmp, opts),
                caution=noise_caution(cmp),
            )
            run = cmp.speculative
            sources = [
                src if drafted else None for src, drafted in zip(run.sources, run.from_draft, strict=True)
            ]
            pieces = list(zip(run.pieces, sources, strict=True)) or [(str(run), None)]
            status = "compare: the run with the draft"
            if v[c["mode"]] == "Chat":  # compare() times plain completions: said so
                status += ", a plain completion of the prompt box (Compare does not run the chat)"
            text = tokens_html(pieces, status=status)
            return {**fit, c["error"]: "", c["result"]: panel, c["output"]: text}
        except Exception as exc:
            if isinstance(exc, LocalspecError):
                gr.Warning(html.escape(exc.message))  # Gradio renders a toast's text as HTML
            return {**fit, c["error"]: friendly(exc), c["result"]: empty_panel_html()}

    def on_request(self, request: gr.Request) -> None:
        """A run, compare or bench was clicked: counted for Stop before it leaves the queue."""
        self.holder.note_request(session_key(request))

    def on_stop(self, request: gr.Request) -> None:
        """Stop the run (or bench) of the session that pressed Stop, not anyone else's, and its runs
        still waiting in the queue."""
        self.holder.request_stop(session_key(request))

    def on_unload(self, request: gr.Request) -> None:
        """The page was closed or reloaded: what its session runs is stopped as its Stop would (a bench
        after the run in progress), and its runs still waiting in the queue are dropped. The page that
        loads next is a new session, with no Stop button for them: they only kept the engine busy."""
        self.holder.request_stop(session_key(request), page_gone=True)

    # -- layout --------------------------------------------------------------------------------

    def build(self) -> gr.Blocks:
        found = pairs.list_presets()
        preset_choices = pairs.preset_choices(found)
        default_preset = (
            constants.EMBEDDED_PRESET
            if any(p.name == constants.EMBEDDED_PRESET for p in found)
            else (found[0].name if found else None)
        )
        # the preset the page opens with sets the Settings too, as picking it does (it opened with the
        # controls' own defaults: p_min 0.75 where the embedded pair's preset says 0.3)
        n_max0, p_min0, adaptive0, strategy0 = self.preset_settings(default_preset) or (
            4,
            0.75,
            False,
            PAIR_DEFAULT,
        )
        c: dict[str, Any] = {}
        self.c = c
        with gr.Blocks(title="localspec", analytics_enabled=False) as demo:
            gr.Markdown(INTRO)
            with gr.Tab("Generate"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=320):
                        gr.Markdown("### 1. Pair")
                        c["source"] = gr.Radio(
                            ["Preset", "My models"], value="Preset", show_label=False, elem_id="ls-source"
                        )
                        with gr.Group(visible=True) as preset_box:
                            c["preset"] = gr.Dropdown(
                                preset_choices, value=default_preset, label="Preset", elem_id="ls-preset"
                            )
                            preset_md = gr.HTML(
                                pairs.preset_info_html(default_preset), elem_id="ls-preset-info"
                            )
                            dl_btn = gr.Button("Download", size="sm", elem_id="ls-download")
                        with gr.Group(visible=False) as own_box:
                            folders = gr.Textbox(
                                label="Folders to scan",
                                placeholder="empty: the usual places "
                                "(HF cache, LM Studio, Ollama, LOCALSPEC_MODELS)",
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
                            c["draft"] = gr.Dropdown(
                                [], label="Draft", allow_custom_value=True, elem_id="ls-draft"
                            )
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
                            default_threads = self.n_threads or constants.default_threads()
                            c["threads"] = gr.Number(
                                0,
                                label=f"CPU threads (1-{max_threads()}; 0 = {default_threads}: "
                                + ("what --threads says)" if self.n_threads else "the physical cores)"),
                                precision=0,
                                elem_id="ls-threads",
                            )
                            c["ngl_t"] = gr.Slider(
                                *GPU_LAYERS_RANGE, 0, step=1, label="Target n_gpu_layers", visible=self.gpu
                            )
                            c["ngl_d"] = gr.Slider(
                                *GPU_LAYERS_RANGE, 0, step=1, label="Draft n_gpu_layers", visible=self.gpu
                            )
                    with gr.Column(scale=2, min_width=480):
                        gr.Markdown("### 2. Run")
                        c["mode"] = gr.Radio(
                            ["Prompt", "Chat"], value="Prompt", show_label=False, elem_id="ls-mode"
                        )
                        c["prompt"] = gr.Textbox(
                            label="Prompt", lines=4, elem_id="ls-prompt", value="def fibonacci(n):"
                        )
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
                                c["temperature"] = gr.Slider(
                                    *TEMPERATURE_RANGE, 0, step=0.05, label="Temperature"
                                )
                            with gr.Row():
                                c["n_max"] = gr.Slider(
                                    *N_MAX_RANGE,
                                    n_max0,
                                    step=1,
                                    label="Draft length n_max",
                                    elem_id="ls-n-max",
                                )
                                c["p_min"] = gr.Slider(
                                    *P_MIN_RANGE, p_min0, step=0.01, label="p_min (draft confidence)"
                                )
                            with gr.Row():
                                c["adaptive"] = gr.Checkbox(adaptive0, label="Adaptive draft length")
                                c["strategy"] = gr.Radio(
                                    STRATEGY_CHOICES,
                                    value=strategy0,
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
                gr.Markdown("### 3. Speed next to memory")
                c["result"] = gr.HTML(empty_panel_html(), elem_id="ls-result-box")
                c["chat"] = gr.State([])
            with gr.Tab("Bench"):
                bench = build_bench_tab(self)
                self.on_bench = bench[2]

            inputs = {v for k, v in c.items() if k not in ("output", "result", "error", "settings_note")}
            outputs = [c["output"], c["result"], c["error"], c["chat"], c["max_tokens"], c["settings_note"]]
            outputs.append(c["prompt"])  # cleared once a chat message was answered
            busy = [c["output"], c["result"], c["error"]]  # the spinner: not on the slider nor the note
            # Every handler taking the sliders checks each value itself (bounded_int, bounded_float: the
            # setting and its range named), so Gradio's own check, which refuses a value out of a slider's
            # range before any handler with "Value 9000 is greater than maximum value 8192." (no setting,
            # no next step), is left out: preprocess=False hands them the values as sent.
            raw: dict[str, Any] = {"preprocess": False}
            # Max tokens' top follows the chosen pair when it is the loaded one; a typed value out of any
            # slider's range gets a note (the browser's slider moves it into range without a word). These
            # take milliseconds: no spinner flashing over the slider and the note at each change.
            mt = c["max_tokens"]
            pair_inputs = {c[k] for k in PAIR_KEYS} | {mt}
            quick: dict[str, Any] = {
                "queue": False,
                "show_progress": "hidden",
                "api_visibility": "private",  # the page's own plumbing, not an API
                **raw,
            }
            for key in ("source", "preset", "target", "draft", "ngl_t", "ngl_d"):
                c[key].change(self.on_pair_choice, pair_inputs, [mt, c["settings_note"]], **quick)
            for event in (c["n_ctx"].blur, c["n_ctx"].submit, c["threads"].blur, c["threads"].submit):
                event(self.on_pair_choice, pair_inputs, [mt, c["settings_note"]], **quick)
            demo.load(self.on_pair_choice, pair_inputs, [mt, c["settings_note"]], **quick)
            mt.release(self.on_max_tokens_typed, pair_inputs, [mt, c["settings_note"]], **quick)
            for key in FIXED_SLIDERS:
                c[key].release(self.on_typed(key), c[key], [c[key], c["settings_note"]], **quick)
            c["source"].change(
                lambda s: (gr.update(visible=s == "Preset"), gr.update(visible=s != "Preset"), ""),
                c["source"],
                [preset_box, own_box, pair_msg],
                queue=False,
            )
            c["mode"].change(lambda m: gr.update(visible=m == "Chat"), c["mode"], clear_btn, queue=False)
            c["preset"].change(
                self.on_preset,
                c["preset"],
                [preset_md, c["n_max"], c["p_min"], c["adaptive"], c["strategy"]],
            )
            dl_btn.click(
                self.on_download,
                c["preset"],
                [pair_msg, preset_md, c["preset"]],
                concurrency_limit=1,
                concurrency_id="download",
            )
            scan_btn.click(
                self.on_scan,
                folders,
                [pair_msg, c["target"], c["draft"], cand_md],
                concurrency_limit=1,
                concurrency_id="scan",
            )
            c["target"].change(
                self.on_target,
                c["target"],
                [pair_msg, c["draft"], cand_md],
                concurrency_limit=1,
                concurrency_id="scan",
            )
            engine: dict[str, Any] = {
                "concurrency_limit": 1,
                "concurrency_id": "engine",
                "show_progress_on": busy,
                **raw,
            }
            # each click is counted as it happens (unqueued), so that a Stop while it waits cancels it
            queued: list[tuple[Any, Callable[..., Any]]] = [
                (run_btn.click, self.on_run),
                (c["prompt"].submit, self.on_run),
                (cmp_btn.click, self.on_compare),
            ]
            for listen, fn in queued:
                listen(self.on_request, None, None, queue=False)
                listen(fn, inputs, outputs, **engine)
            stop_btn.click(self.on_stop, None, None, queue=False)
            if bench is not None:
                button, bench_stop, fn, bench_outputs = bench
                button.click(self.on_request, None, None, queue=False)
                button.click(fn, inputs, bench_outputs, concurrency_limit=1, concurrency_id="engine", **raw)
                bench_stop.click(self.on_stop, None, None, queue=False)
            clear_btn.click(
                lambda: ([], tokens_html([]), ""), None, [c["chat"], c["output"], c["error"]], queue=False
            )
            demo.unload(self.on_unload)
        demo.queue(default_concurrency_limit=1)
        return demo


def output_grammar(choice: str, schema_text: str | None) -> Grammar | None:
    """The Output setting as a grammar: free text (None), any JSON object, or JSON matching the schema typed
    in the box; a schema that is not JSON, or that a grammar cannot spell, is refused with the next step."""
    if choice == "Text":
        return None
    if choice == "JSON":
        return Grammar.json_object()
    if choice != "JSON schema":
        raise LocalspecError(f"output {choice!r} is not one of {', '.join(FORMAT_CHOICES)}", hint="pick one")
    text = (schema_text or "").strip()
    example = 'e.g. {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
    if not text:
        raise LocalspecError("the JSON schema box is empty", hint="type a schema, " + example)
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise LocalspecError(f"the JSON schema is not valid JSON ({exc})", hint=example) from None
    return Grammar.json_schema(schema, what="JSON schema")


def theme() -> Any:
    """The default theme with system fonts, so nothing is fetched from a font CDN (works offline)."""
    return gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])


def build_app(loader: Callable[..., Any] = _load, *, n_threads: int | None = None) -> gr.Blocks:
    return App(loader, n_threads=n_threads).build()


def launch(
    host: str = "127.0.0.1",
    port: int = 7860,
    share: bool = False,
    *,
    auth: tuple[str, str] | None = None,
    open_browser: bool = False,
    block: bool = True,
    n_threads: int | None = None,
) -> Any:
    """Serve the page; ``block=False`` returns at once (the server runs in a thread). Who may reach it is
    decided before (``localspec.serve.exposure``, in ``localspec ui``); ``auth`` is the login Gradio asks for,
    ``open_browser`` opens the default browser on the page once it is up; ``n_threads``: what every pair
    loads with (None: the library's default)."""
    demo = build_app(n_threads=n_threads)
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
