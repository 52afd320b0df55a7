"""``load()`` and ``generate()``: what to run resolved, checked and loaded into a :class:`Pipeline`.

Resolving what to run happens here: a preset (downloaded on first use), explicit paths, or the embedded
pair; the draft as a path, ``"ngram"``, ``"none"`` or ``None`` (automatic pairing: the best compatible
draft the scanner finds). A pair is checked from the GGUF headers before anything loads.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, overload

from localspec import constants
from localspec.errors import LocalspecError, ModelNotFoundError, SettingsError
from localspec.gguf.pairing import check_pair, drafter_file_kind
from localspec.pipeline.models import DEFAULT_PARALLEL
from localspec.pipeline.pipeline import Pipeline
from localspec.pipeline.results import GenerationResult
from localspec.settings import (
    DRAFT_MODEL,
    DRAFT_WORDS,
    PROMPT_LOOKUP,
    STRATEGY_BY_NAME,
    TARGET_ALONE,
    DraftSettings,
    Strategy,
)


def _check_file(path: str | os.PathLike, role: str) -> Path:
    """``path`` when it names a regular file; else what it is instead (``Path.is_file`` says False for a
    folder or a symlink loop, and raises for a name too long for the file system)."""
    p = Path(path).expanduser()
    scan_hint = "check the path, or run `localspec scan` to list the GGUF models on this machine"
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        problem = {
            errno.ENOENT: "no such file",
            errno.ENOTDIR: "no such file (a part of the path is not a folder)",
            errno.ELOOP: "is a symlink loop (a link that points back to itself)",
            errno.ENAMETOOLONG: "the path is too long for this file system",
        }.get(exc.errno or 0, f"cannot be read ({exc.strerror or exc})")
        raise ModelNotFoundError(f"{role} model {_short(p)}: {problem}", hint=scan_hint) from None
    if stat.S_ISDIR(mode):
        raise ModelNotFoundError(
            f"{role} model {_short(p)} is a folder, not a GGUF file",
            hint=f"give the .gguf file inside it (`localspec scan {_short(p)}` lists them)",
        )
    if not stat.S_ISREG(mode):
        raise ModelNotFoundError(
            f"{role} model {_short(p)} is not a regular file (a FIFO, socket or device)", hint=scan_hint
        )
    return p


def _short(p: Path) -> str:
    """A path for a message: a very long one shortened in the middle."""
    text = str(p)
    return text if len(text) <= 200 else f"{text[:90]}...{text[-90:]}"


def _auto_draft(target: Path) -> tuple[Path | None, str]:
    """The best compatible draft the scanner finds for ``target``, or None, with the reason."""
    if target.resolve() == constants.EMBEDDED_TARGET.resolve():
        return constants.EMBEDDED_DRAFT, "embedded pair: its own draft"
    try:
        from localspec.gguf.scan import find_drafts

        ranked = [r for r in find_drafts(target) if r.fits]
    except (LocalspecError, OSError) as exc:
        return None, f"automatic pairing failed ({exc}); running the target alone"
    if not ranked:
        folders = [str(d) for d in constants.default_scan_dirs()] + [f"{target.parent} (the target's)"]
        return None, (
            f"no compatible draft found in {', '.join(folders)}; running the target alone: "
            "n-gram lookup needs no draft model (--draft ngram, or draft='ngram' in Python)"
        )
    best = ranked[0]
    return Path(best.model.path), f"automatic pairing picked {Path(best.model.path).name}: {best.why}"


def _may_use_model(strategy: str | Strategy) -> bool:
    """True when ``strategy`` (or the strategy it names) may run a draft model (an unknown name is refused
    later)."""
    kind = strategy if isinstance(strategy, Strategy) else STRATEGY_BY_NAME.get(strategy)
    return kind is not None and kind.may_use_model


def _preset_settings(ds: object) -> DraftSettings:
    """A preset's ``[draft]`` table as :class:`DraftSettings` (same field names), validated."""
    if isinstance(ds, DraftSettings):
        return ds
    return DraftSettings(
        **{f.name: getattr(ds, f.name) for f in fields(DraftSettings) if hasattr(ds, f.name)}
    )


def load(
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    preset: str | None = None,
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
    draft_n_threads: int | None = None,
    draft_n_gpu_layers: int | None = None,
    strategy: str | None = None,
    n_max: int | None = None,
    n_min: int | None = None,
    p_min: float | None = None,
    adaptive: bool | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    suffix_store: bool = True,
    corpus: str | os.PathLike | None = None,
    store_namespace: str = "default",
    rpc: str | Sequence[str] | None = None,
    tensor_split: Sequence[float] | None = None,
    parallel: int | None = 1,
    prompt_cache_mb: float = constants.DEFAULT_PROMPT_CACHE_MB,
) -> Pipeline:
    """Load a target and a draft (or a model-free drafter) into a reusable :class:`Pipeline`.

    The draft settings come from the preset (its ``[draft]`` table), then ``draft``, then the explicit
    arguments, each overriding the one before; a draft model is loaded only when the strategy uses it.

    Args:
        target: the target GGUF; None (no ``preset`` either): the embedded pair.
        draft: a draft GGUF, ``"ngram"`` or ``"none"`` (a strategy without a draft model), or ``"auto"``
            / None: the preset's draft, else the best compatible draft the scanner finds.
        preset: a preset name (downloaded on first use); not with ``target``.
        n_ctx: the context; None: the preset's, else the default (at most the target's trained one).
        strategy: the drafting strategy (see :class:`DraftSettings`).
        n_max: the longest draft.
        n_min, p_min: the draft model drafts ``n_min`` tokens at least before a top probability below
            ``p_min`` stops its draft.
        adaptive: let the adaptive controller pick the draft model's lengths.
        progress: called as ``progress(what, done, total)`` while a preset downloads.
        n_threads, n_gpu_layers, draft_n_threads, draft_n_gpu_layers, suffix_store, corpus, store_namespace,
            rpc, tensor_split, parallel, prompt_cache_mb: as :class:`Pipeline` takes them.

    Returns:
        The loaded :class:`Pipeline` (close it, or use it as a context manager, to free the models).

    Raises:
        SettingsError: an empty ``target``/``draft``/``preset``, or settings out of range.
        ValueError: both ``preset`` and ``target``.
        ModelNotFoundError: a model file that is missing, a folder, or not a regular file.
        RpcError: an rpc-server that does not answer (said within seconds), or a build without RPC.
        LocalspecError: any other reason the pair cannot load (an incompatible pair, an unknown preset, a
            failed download, ...), with a hint.
    """
    _refuse_empty_names(target=target, draft=draft, preset=preset)
    if preset is None and target is None:  # the embedded pair, with its preset's draft settings
        preset = constants.EMBEDDED_PRESET
    plan = _plan_target(target, preset, n_ctx, progress)
    _plan_draft(plan, draft, preset, strategy)
    _plan_settings(plan, strategy=strategy, n_max=n_max, n_min=n_min, p_min=p_min, adaptive=adaptive)
    info = check_pair(plan.target, plan.draft, label=f"preset '{preset}'" if preset else "")
    info.note = plan.note + "".join(f"; warning: {w}" for w in info.warnings)  # (a swapped pair, say)
    return Pipeline(
        info,
        n_ctx=constants.DEFAULT_N_CTX if plan.n_ctx is None else plan.n_ctx,
        n_threads=n_threads,
        n_gpu_layers=n_gpu_layers,
        draft_n_threads=draft_n_threads,
        draft_n_gpu_layers=draft_n_gpu_layers,
        settings=plan.settings,
        suffix_store=suffix_store,
        corpus=corpus,
        store_namespace=store_namespace,
        rpc=rpc,
        tensor_split=tensor_split,
        parallel=parallel,
        prompt_cache_mb=prompt_cache_mb,
    )


@dataclass
class _LoadPlan:
    """What :func:`load` settles, step by step, before anything loads: the files and the settings."""

    target: Path
    settings: DraftSettings
    note: str = ""  # what the pipeline says it runs (``PairInfo.note``)
    n_ctx: int | None = None
    preset_draft: Path | None = None  # the preset's draft model, if it has one
    draft: Path | None = None  # the draft model to load (None: none)


def _refuse_empty_names(**names: str | os.PathLike | None) -> None:
    """An empty string for a file or preset is a mistake (``Path("")`` is ".", the current folder)."""
    for name, value in names.items():
        if isinstance(value, str) and not value.strip():
            raise SettingsError(
                f"{name} is an empty string",
                hint="give a path" + (", 'ngram', 'none' or 'auto'" if name == "draft" else "")
                if name != "preset"
                else "give a preset name (`localspec presets` lists them)",
            )


def _plan_target(
    target: str | os.PathLike | None,
    preset: str | None,
    n_ctx: int | None,
    progress: Callable[[str, int, int], None] | None,
) -> _LoadPlan:
    """The target file and the starting settings: the preset's (downloaded, not checked yet: the pair is
    checked once, in :func:`load`), or a target path's with the default settings."""
    if preset is None:
        assert target is not None
        plan = _LoadPlan(_check_file(target, "target"), DraftSettings(), n_ctx=n_ctx)
    else:
        if target is not None:
            raise ValueError("give either preset= or target=, not both")
        from localspec.hub.download import ensure_preset

        pair = ensure_preset(preset, progress=progress, check=False)  # checked once, in load()
        settings = _preset_settings(pair.preset.draft)
        if settings.uses_model and pair.draft is None:  # a preset without a draft model cannot use one
            lookup_only = PROMPT_LOOKUP if settings.strategy.lookup == PROMPT_LOOKUP.lookup else TARGET_ALONE
            settings = settings.with_overrides(strategy=lookup_only)
        note = "embedded default pair" if preset == constants.EMBEDDED_PRESET else f"preset {preset}"
        n_ctx = pair.preset.n_ctx if n_ctx is None else n_ctx
        plan = _LoadPlan(Path(pair.target), settings, note, n_ctx, preset_draft=pair.draft)
    if not plan.target.is_file():
        raise ModelNotFoundError(
            f"target model {plan.target}: no such file",
            hint="reinstall localspec, or name a model with target=PATH",
        )
    return plan


def _plan_draft(
    plan: _LoadPlan, draft: str | os.PathLike | None, preset: str | None, strategy: str | None
) -> None:
    """The draft model: the one named, a model-free drafter named instead, the preset's, or (for a strategy
    that may use one) the best compatible draft the scanner finds."""
    if draft is not None and str(draft) == "auto":  # the word every command's --draft takes
        draft = None
    word = DRAFT_WORDS.get(str(draft)) if draft is not None else None
    if word is not None:
        plan.settings = plan.settings.with_overrides(strategy=word)
        plan.note = plan.note or (
            "target alone" if not word.drafts else "n-gram prompt lookup, no draft model"
        )
    elif draft is not None:
        plan.draft = _check_file(draft, "draft")
        if not plan.settings.may_use_model:
            plan.settings = plan.settings.with_overrides(strategy=DRAFT_MODEL)
        plan.note = plan.note or f"draft {plan.draft.name}"
    elif preset is not None:
        plan.draft = plan.preset_draft
    elif _may_use_model(strategy or plan.settings.strategy):  # auto may choose the model
        plan.draft, plan.note = _auto_draft(plan.target)
        if plan.draft is None and strategy is None:
            plan.settings = plan.settings.with_overrides(strategy=TARGET_ALONE)


def _plan_settings(plan: _LoadPlan, *, strategy: str | None, n_max: int | None, **overrides: Any) -> None:
    """The explicit arguments over the settings so far; a draft model the result does not use is dropped
    (a strategy without the draft model must not pay for loading it)."""
    plan.settings = plan.settings.switched_to(strategy, n_max=n_max, **overrides)
    drafter_file = plan.draft is not None and drafter_file_kind(plan.draft) is not None
    keeps_assistant = plan.settings.uses_mtp and drafter_file
    if not plan.settings.may_use_model and plan.draft is not None and not keeps_assistant:
        plan.note += f" (strategy {plan.settings.strategy}: draft model not loaded)"
        plan.draft = None
    if not plan.note:
        s = plan.settings
        plan.note = "target alone" if not s.is_speculative else f"strategy {s.strategy}, no draft model"


_LOAD_KEYS = {
    "rpc",
    "parallel",
    "tensor_split",
    "n_ctx",
    "n_threads",
    "n_gpu_layers",
    "draft_n_threads",
    "draft_n_gpu_layers",
    "progress",
    "suffix_store",
    "corpus",
    "store_namespace",
    "prompt_cache_mb",
}
_CACHE: dict[tuple, Pipeline] = {}


@overload
def generate(
    prompt: str,
    *,
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    preset: str | None = None,
    max_tokens: int = constants.DEFAULT_MAX_TOKENS,
    temperature: float = 0.0,
    **opts,
) -> GenerationResult: ...


@overload
def generate(
    prompt: Sequence[str],
    *,
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    preset: str | None = None,
    max_tokens: int = constants.DEFAULT_MAX_TOKENS,
    temperature: float = 0.0,
    **opts,
) -> list[GenerationResult]: ...


def generate(
    prompt: str | Sequence[str],
    *,
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    preset: str | None = None,
    max_tokens: int = constants.DEFAULT_MAX_TOKENS,
    temperature: float = 0.0,
    **opts,
) -> GenerationResult | list[GenerationResult]:
    """Generate text in one line. The loaded pipeline is kept for the next call with the same models.

    Args:
        prompt: the text to continue, or a list of texts: they run at once (``parallel`` of them, default
            up to 4, in one target pass per step: :meth:`Pipeline.generate_many`).
        target: as for :func:`load`.
        draft: as for :func:`load`.
        preset: as for :func:`load`.
        max_tokens: the most tokens to generate.
        temperature: 0 for greedy decoding, else sampling.
        **opts: :func:`load`'s keyword arguments (``n_ctx``, ``n_threads``, ``suffix_store``, ``parallel``,
            ...) and :meth:`Pipeline.stream_tokens`'s (``strategy``, ``stop``, ``seed``, ``grammar``, ...).

    Returns:
        The text, a :class:`GenerationResult` carrying its stats and tokens; for a list, one per prompt, in
        order.

    Raises:
        LocalspecError: what :func:`load` or :meth:`Pipeline.stream_tokens` raises (bad arguments, a
            prompt that does not fit the context, a model that does not load).
    """
    many = not isinstance(prompt, str)
    if many and "parallel" not in opts:
        opts["parallel"] = max(1, min(len(prompt), DEFAULT_PARALLEL))
    load_kw = {k: opts.pop(k) for k in list(opts) if k in _LOAD_KEYS}
    key = (str(target), str(draft), preset, tuple(sorted((k, str(v)) for k, v in load_kw.items())))
    pipe = _CACHE.get(key)
    if pipe is None or pipe.closed:  # (a caller may have closed the one it was handed)
        for old in _CACHE.values():  # one pair in memory at a time
            old.close()
        _CACHE.clear()
        pipe = load(target, draft, preset, **load_kw)
        _CACHE[key] = pipe
    if isinstance(prompt, str):
        return pipe.generate(prompt, max_tokens=max_tokens, temperature=temperature, **opts)
    return pipe.generate_many(list(prompt), max_tokens=max_tokens, temperature=temperature, **opts)
