"""The public API: ``generate`` (one line) over ``load`` (a reusable :class:`Pipeline`).

Resolving what to run happens here: a preset (downloaded on first use), explicit paths, or the
embedded pair; the draft as a path, ``"ngram"``, ``"none"`` or ``None`` (automatic pairing: the best
compatible draft the scanner finds). A pair is checked from the GGUF headers before anything loads.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from localspec import constants
from localspec.drafters import CombinedDrafter, ModelDrafter, NgramDrafter
from localspec.engine import Engine, TokenResponse
from localspec.errors import (
    ContextOverflowError,
    LocalspecError,
    ModelNotFoundError,
)
from localspec.pairing import PairInfo, check_pair
from localspec.runtime import Model
from localspec.sampling import SamplingParams
from localspec.stats import Comparison, GenerationStats, MemoryReport, rss_bytes

STRATEGIES = ("model", "ngram", "model+ngram", "none")


class GenerationResult(str):
    """The generated text (a ``str``), carrying ``.stats``, ``.tokens``, ``.from_draft`` and ``.pieces``.

    ``pieces`` is the text as it was streamed, one string per token (``"".join(pieces)`` is the text).
    """

    stats: GenerationStats
    tokens: list[int]
    from_draft: list[bool]
    pieces: list[str]

    def __new__(
        cls,
        text: str,
        stats: GenerationStats,
        tokens: list[int],
        from_draft: list[bool],
        pieces: list[str] | None = None,
    ):
        obj = super().__new__(cls, text)
        obj.stats, obj.tokens, obj.from_draft = stats, tokens, from_draft
        obj.pieces = pieces if pieces is not None else []
        return obj

    @property
    def text(self) -> str:
        return str(self)


@dataclass
class DraftOptions:
    n_max: int = 4
    n_min: int = 0
    p_min: float = 0.75
    adaptive: bool = False


class Pipeline:
    """A loaded target (and draft). Reuse it: models stay loaded, KV caches are reused across calls."""

    def __init__(
        self,
        info: PairInfo,
        *,
        n_ctx: int = constants.DEFAULT_N_CTX,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        draft_n_threads: int | None = None,
        draft_n_gpu_layers: int = 0,
        options: DraftOptions | None = None,
    ) -> None:
        self.info = info
        self.options = options or DraftOptions()
        threads = n_threads or constants.default_threads()
        mem = MemoryReport(rss_baseline_bytes=rss_bytes())
        self._target = Model(info.target_path, n_ctx=n_ctx, n_threads=threads, n_gpu_layers=n_gpu_layers)
        mem.rss_after_target_bytes = rss_bytes()
        mem.target_weights_bytes = self._target.weights_bytes
        mem.target_kv_bytes = self._target.kv_bytes()
        self._draft: Model | None = None
        try:
            if info.draft_path is not None:
                self._draft = Model(
                    info.draft_path,
                    n_ctx=n_ctx,
                    n_threads=draft_n_threads or threads,
                    n_gpu_layers=draft_n_gpu_layers,
                )
                mem.rss_after_draft_bytes = rss_bytes()
                mem.draft_weights_bytes = self._draft.weights_bytes
                mem.draft_kv_bytes = self._draft.kv_bytes()
        except BaseException:
            self._target.close()
            raise
        self.memory = mem
        self._engine = Engine(self._target)
        self._ngram = NgramDrafter()
        self._model_drafter = (
            ModelDrafter(
                self._draft,
                target_n_vocab=self._target.n_vocab,
                masked_ids=info.masked_ids,
                n_min=self.options.n_min,
                p_min=self.options.p_min,
            )
            if self._draft
            else None
        )
        self._chat = None

    # Lifecycle --------------------------------------------------------------------------------
    def close(self) -> None:
        for m in (self._draft, self._target):
            if m is not None:
                m.close()
        self._draft = None

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def n_ctx(self) -> int:
        return self._target.n_ctx

    # Generation -------------------------------------------------------------------------------
    def _drafter(self, strategy: str):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if strategy in ("model", "model+ngram") and self._model_drafter is None:
            raise LocalspecError(
                f"strategy {strategy!r} needs a draft model, and this pipeline has none",
                hint="load with draft=PATH (or a preset with a draft), or use strategy='ngram'",
            )
        if strategy == "model":
            return self._model_drafter
        if strategy == "ngram":
            return self._ngram
        if strategy == "model+ngram":
            return CombinedDrafter(self._model_drafter, self._ngram)
        return None

    def stream_tokens(
        self,
        tokens: list[int],
        *,
        max_tokens: int = constants.DEFAULT_MAX_TOKENS,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        strategy: str | None = None,
        n_max: int | None = None,
        n_min: int | None = None,
        p_min: float | None = None,
        adaptive: bool | None = None,
        baseline: bool = False,
    ) -> Iterator[TokenResponse]:
        """Generate from already tokenized input. One :class:`TokenResponse` per token."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if len(tokens) + max_tokens > self.n_ctx:
            raise ContextOverflowError(
                f"the prompt ({len(tokens)} tokens) plus max_tokens ({max_tokens}) exceeds the context "
                f"window of {self.n_ctx} tokens",
                hint=f"shorten the prompt, lower max_tokens to {max(1, self.n_ctx - len(tokens))} or less, "
                "or load with a larger n_ctx",
            )
        params = SamplingParams(temperature, top_k, top_p, min_p, seed)
        params.validate()
        strategy = "none" if baseline else (strategy or self.info.strategy)
        drafter = self._drafter(strategy)
        o = self.options
        if self._model_drafter is not None:
            self._model_drafter.p_min = o.p_min if p_min is None else p_min
            self._model_drafter.n_min = o.n_min if n_min is None else n_min
        stats = GenerationStats(
            strategy=strategy,
            draft_name=(self.info.draft_path.name if self.info.draft_path and "model" in strategy else None),
            pairing_note=self.info.note,
            memory=self.memory,
        )
        return self._engine.stream(
            tokens,
            drafter=drafter,
            max_tokens=max_tokens,
            params=params,
            n_max=o.n_max if n_max is None else n_max,
            n_min=o.n_min if n_min is None else n_min,
            adaptive=o.adaptive if adaptive is None else adaptive,
            stop=stop,
            stats=stats,
        )

    def tokenize(self, text: str) -> list[int]:
        return self._target.tokenize(text, add_bos=True, special=True)

    def stream(self, prompt: str, **kwargs) -> Iterator[TokenResponse]:
        """Stream a plain completion of ``prompt``."""
        return self.stream_tokens(self.tokenize(prompt), **kwargs)

    def generate(self, prompt: str, **kwargs) -> GenerationResult:
        return _collect(self.stream(prompt, **kwargs))

    def chat_stream(self, messages: list[dict], **kwargs) -> Iterator[TokenResponse]:
        """Stream a reply to ``messages`` formatted with the model's own chat template."""
        tokens, stops = self.format_chat(messages)
        kwargs["stop"] = list(kwargs.get("stop") or []) + stops
        return self.stream_tokens(tokens, **kwargs)

    def chat(self, messages: list[dict], **kwargs) -> GenerationResult:
        return _collect(self.chat_stream(messages, **kwargs))

    def format_chat(self, messages: list[dict]) -> tuple[list[int], list[str]]:
        """``messages`` rendered with the target's own chat template: (prompt tokens, stop strings)."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        meta = self._target.metadata
        template = meta.get("tokenizer.chat_template")
        if not template:
            raise LocalspecError(
                f"{self.info.target_path.name} has no chat template in its metadata",
                hint="use generate()/stream() with a plain prompt instead of chat()",
            )
        if self._chat is None:
            llama = self._target.llama
            bos = llama._model.token_get_text(llama.token_bos()) if llama.token_bos() >= 0 else ""
            eos = llama._model.token_get_text(llama.token_eos()) if llama.token_eos() >= 0 else ""
            self._chat = (Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos), bos)
        formatter, bos = self._chat
        response = formatter(messages=messages)
        prompt = response.prompt
        add_bos = not (bos and prompt.startswith(bos))
        tokens = self._target.tokenize(prompt, add_bos=add_bos, special=True)
        stops = (
            response.stop if isinstance(response.stop, list) else ([response.stop] if response.stop else [])
        )
        return tokens, [s for s in stops if s]

    def compare(self, prompt: str, *, repeats: int = 1, warmup: bool = True, **kwargs) -> Comparison:
        """Target alone and speculative on the same prompt, interleaved, in this process.

        A short uncounted run of each side first, so neither pays for cold caches and page faults
        (on a small model the first call can be several times slower than the next).
        """
        kwargs.pop("baseline", None)
        if warmup:
            short = {**kwargs, "max_tokens": min(8, kwargs.get("max_tokens", constants.DEFAULT_MAX_TOKENS))}
            self.generate(prompt, baseline=True, **short)
            self.generate(prompt, **short)
        base_runs, spec_runs = [], []
        for _ in range(max(1, repeats)):
            base_runs.append(self.generate(prompt, baseline=True, **kwargs))
            spec_runs.append(self.generate(prompt, **kwargs))
        b_tps = [r.stats.tokens_per_second for r in base_runs]
        s_tps = [r.stats.tokens_per_second for r in spec_runs]
        speedup = statistics.median(s_tps) / statistics.median(b_tps) if statistics.median(b_tps) else 0.0
        spec = spec_runs[-1]
        spec.stats.speedup = speedup
        return Comparison(
            baseline=base_runs[-1],
            speculative=spec,
            speedup=speedup,
            baseline_tps=b_tps,
            speculative_tps=s_tps,
            same_text=str(base_runs[-1]) == str(spec),
        )


def _collect(stream: Iterator[TokenResponse]) -> GenerationResult:
    parts, tokens, flags = [], [], []
    stats = None
    for r in stream:
        parts.append(r.text)
        tokens.append(r.token)
        flags.append(r.from_draft)
        stats = r.stats
    if stats is None:  # pragma: no cover - the engine always yields at least one token
        stats = GenerationStats()
    return GenerationResult("".join(parts), stats, tokens, flags, parts)


# Resolution -----------------------------------------------------------------------------------
def _check_file(path: str | os.PathLike, role: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelNotFoundError(
            f"{role} model {p}: no such file",
            hint="check the path, or run `localspec scan` to list the GGUF models on this machine",
        )
    return p


def _auto_draft(target: Path) -> tuple[Path | None, str]:
    """The best compatible draft the scanner finds for ``target``, or None, with the reason."""
    if target.resolve() == constants.EMBEDDED_TARGET.resolve():
        return constants.EMBEDDED_DRAFT, "embedded pair: its own draft"
    try:
        from localspec.scan import find_drafts

        ranked = [r for r in find_drafts(target) if r.fits]
    except (LocalspecError, OSError) as exc:
        return None, f"automatic pairing failed ({exc}); running the target alone"
    if not ranked:
        return None, (
            "no compatible draft found by `localspec scan` (searched "
            + (", ".join(str(d) for d in constants.default_scan_dirs()) or "no model folders")
            + f", and {target.parent}); running the target alone: try draft='ngram'"
        )
    best = ranked[0]
    return Path(best.model.path), f"automatic pairing picked {Path(best.model.path).name}: {best.why}"


def load(
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    preset: str | None = None,
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int = 0,
    draft_n_threads: int | None = None,
    draft_n_gpu_layers: int = 0,
    n_max: int | None = None,
    n_min: int | None = None,
    p_min: float | None = None,
    adaptive: bool | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Pipeline:
    """Load a target and a draft (or a model-free drafter) into a reusable :class:`Pipeline`."""
    opts = DraftOptions()
    note = ""
    if preset is None and target is None:  # the embedded pair, with its preset's draft settings
        preset = constants.EMBEDDED_PRESET
    if preset is not None:
        if target is not None:
            raise ValueError("give either preset= or target=, not both")
        from localspec.hub import ensure_preset

        pair = ensure_preset(preset, progress=progress)
        ds = pair.preset.draft
        opts = DraftOptions(n_max=ds.n_max, n_min=ds.n_min, p_min=ds.p_min, adaptive=ds.adaptive)
        target_path = pair.target
        n_ctx = n_ctx or pair.preset.n_ctx
        if draft is None:
            draft = (
                pair.draft if pair.draft is not None else (ds.strategy if ds.strategy == "ngram" else "none")
            )
            note = "embedded default pair" if preset == constants.EMBEDDED_PRESET else f"preset {preset}"
    else:
        target_path = _check_file(target, "target")
    target_path = Path(target_path)
    if not target_path.is_file():
        raise ModelNotFoundError(
            f"target model {target_path}: no such file",
            hint="reinstall localspec, or name a model with target=PATH",
        )

    strategy = None
    draft_path: Path | None = None
    if draft is None:
        draft_path, note = _auto_draft(target_path)
    elif str(draft) in ("none", "ngram"):
        strategy = str(draft)
        note = note or ("target alone" if strategy == "none" else "n-gram prompt lookup, no draft model")
    else:
        draft_path = _check_file(draft, "draft")
        note = note or f"draft {draft_path.name}"

    info = check_pair(target_path, draft_path)
    info.note = note
    if strategy is not None:
        info.strategy = strategy
    for name, value in (("n_max", n_max), ("n_min", n_min), ("p_min", p_min), ("adaptive", adaptive)):
        if value is not None:
            setattr(opts, name, value)
    return Pipeline(
        info,
        n_ctx=n_ctx or constants.DEFAULT_N_CTX,
        n_threads=n_threads,
        n_gpu_layers=n_gpu_layers,
        draft_n_threads=draft_n_threads,
        draft_n_gpu_layers=draft_n_gpu_layers,
        options=opts,
    )


_LOAD_KEYS = {"n_ctx", "n_threads", "n_gpu_layers", "draft_n_threads", "draft_n_gpu_layers", "progress"}
_CACHE: dict[tuple, Pipeline] = {}


def generate(
    prompt: str,
    *,
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    preset: str | None = None,
    max_tokens: int = constants.DEFAULT_MAX_TOKENS,
    temperature: float = 0.0,
    **opts,
) -> GenerationResult:
    """Generate text in one line. The loaded pipeline is kept for the next call with the same models."""
    load_kw = {k: opts.pop(k) for k in list(opts) if k in _LOAD_KEYS}
    key = (str(target), str(draft), preset, tuple(sorted((k, str(v)) for k, v in load_kw.items())))
    pipe = _CACHE.get(key)
    if pipe is None:
        for old in _CACHE.values():  # one pair in memory at a time
            old.close()
        _CACHE.clear()
        pipe = load(target, draft, preset, **load_kw)
        _CACHE[key] = pipe
    return pipe.generate(prompt, max_tokens=max_tokens, temperature=temperature, **opts)
