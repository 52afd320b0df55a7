"""The Generate tab's controls read and checked: which pair they choose (:meth:`Controls.spec`), the run's
settings (:meth:`Controls.gen_opts`), Max tokens kept within what the loaded pair's context leaves, and the
handlers that fill the pair controls (presets, downloads, scans)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from localspec import constants
from localspec.constrain.grammar import Grammar
from localspec.errors import LocalspecError, ModelNotFoundError, SettingsError
from localspec.gguf.meta import read_metadata
from localspec.hub import presets
from localspec.pipeline.chat_turns import chat_messages
from localspec.settings import MTP_STRATEGIES, N_MAX_RANGE, P_MIN_RANGE, STRATEGIES, max_threads

from . import pairs
from .common import (
    GPU_LAYERS_RANGE,
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
    typed_note,
)
from .render import error_html, ok_html
from .session import PairSpec, PipelineHolder

if TYPE_CHECKING:
    from localspec.pipeline.pipeline import Pipeline

PAIR_DEFAULT = "pair default"
#: The Strategy radio: the pair's (or preset's) own strategy, or one of localspec's.
STRATEGY_CHOICES = [PAIR_DEFAULT, *STRATEGIES]


@dataclass(frozen=True)
class DraftControls:
    """Draft settings as the Settings controls hold them (a preset's, or the controls' own defaults)."""

    n_max: int = 4
    p_min: float = 0.75
    adaptive: bool = False
    strategy: str = PAIR_DEFAULT  # one of STRATEGY_CHOICES

    def updates(self) -> tuple[Any, ...]:
        """One update per control, in the order of :data:`DRAFT_CONTROL_KEYS`."""
        return tuple(gr.update(value=getattr(self, key)) for key in DRAFT_CONTROL_KEYS)


#: The Settings controls a preset sets (keys of the page's components), in the order handlers return them.
DRAFT_CONTROL_KEYS = ("n_max", "p_min", "adaptive", "strategy")
#: The Output setting: free text, any JSON object, or JSON matching a schema typed in the page.
FORMAT_CHOICES = ["Text", "JSON", "JSON schema"]
#: The controls that decide which pair is loaded (what :meth:`Controls.spec` reads).
PAIR_KEYS = ("source", "preset", "target", "draft", "n_ctx", "threads", "ngl_t", "ngl_d", "rpc")
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


def load_pipeline(**kwargs: Any) -> Pipeline:
    """``localspec.load``, looked up when called (the page's default loader)."""
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


def check_rpc(text: str | None) -> str | None:
    """The RPC servers box (``HOST:PORT,...``; empty: none) checked as ``--rpc`` is: a SettingsError with the
    same words, before anything loads.

    Args:
        text: what the box holds.

    Returns:
        The servers, normalized (``HOST:PORT`` items joined by commas), or None for an empty box.
    """
    from localspec.llama.rpc import parse_endpoints

    text = (text or "").strip()
    return ",".join(map(str, parse_endpoints(text))) if text else None


def check_slider(key: str, value: Any) -> Any:
    """``value`` of the fixed-range slider ``key`` (:data:`FIXED_SLIDERS`), checked: a SettingsError names the
    setting and its range."""
    label, bounds, check = FIXED_SLIDERS[key]
    return check(value, bounds, label)


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


class Controls:
    """The page's state: one PipelineHolder and the last scan, shared by every browser tab (a Stop is per
    browser session); the controls' values read and checked, and the handlers of the pair controls."""

    #: the page's controls by key (set when the page is built): a handler's values are keyed by them
    c: dict[str, Any]

    def __init__(
        self,
        loader: Callable[..., Pipeline] = load_pipeline,
        *,
        n_threads: int | None = None,
        rpc: str | None = None,
        preset: str | None = None,
    ) -> None:
        self.holder = PipelineHolder(loader)
        self.preset = preset  # the preset the page opens on (`localspec ui --preset`; None: the last one)
        self.n_threads = n_threads  # every pair loads with these (`localspec ui --threads`)
        self.rpc = rpc  # what the RPC servers box starts with (`localspec ui --rpc`)
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
        rpc = check_rpc(v[c["rpc"]])
        mtp = v.get(c["strategy"]) in MTP_STRATEGIES  # the MTP layers load with the target (not every
        # handler is given the strategy: one that is not compares pairs without it)
        if v[c["source"]] == "Preset":
            name = v[c["preset"]] or constants.EMBEDDED_PRESET
            return PairSpec(
                preset=name,
                n_ctx=check_n_ctx(n_ctx_value),
                n_gpu_layers=ngl_t,
                draft_n_gpu_layers=ngl_d,
                n_threads=threads,
                rpc=rpc,
                mtp=mtp,
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
            rpc=rpc,
            mtp=mtp,
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
    def prompt_tokens(pipe: Pipeline, prompt: str, messages: list[dict] | None) -> int | None:
        """How many tokens this run's prompt takes (a chat's as its template renders it); None when it
        cannot be told here (the run itself then says what is wrong)."""
        try:
            if messages is None:
                return len(pipe.tokenize(prompt))
            return len(pipe.format_chat(chat_messages(messages))[0])
        except Exception:
            return None

    @staticmethod
    def preset_settings(name: str | None) -> DraftControls | None:
        """A preset's draft settings as the Settings controls hold them, or None when it does not load (its
        facts box says why): for the preset the page opens with, and for each one picked after."""
        try:
            d = presets.get_preset(name).draft if name else None
        except LocalspecError:
            return None
        if d is None:
            return None
        strategy = d.strategy.name if d.strategy.name in STRATEGY_CHOICES else PAIR_DEFAULT
        return DraftControls(d.n_max, d.p_min, d.adaptive, strategy)

    def on_preset(self, name: str):
        """The preset's facts, and its draft settings (strategy included) into the Settings controls."""
        md = pairs.preset_info_html(name)
        chosen = self.preset_settings(name)
        if chosen is None:
            return (md, *(gr.update() for _ in DRAFT_CONTROL_KEYS))
        return (md, *chosen.updates())

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
