"""A pair's drafting settings as a serving engine's configuration: llama-server flags or vLLM's
``speculative_config`` (``localspec export``, docs/export.md).

The settings come in resolved: one strategy (``auto`` already routed) and the model drafter's length, which
``localspec export`` takes from what this machine measured (:mod:`localspec.bench.exported`). Lookups
chained before a model drafter become llama-server's ``ngram-mod`` in front of ``draft-simple`` or
``draft-mtp`` (``--spec-type ngram-mod,draft-simple``: llama.cpp tries its types in that order). What an
engine cannot express (the suffix cache, a combination in vLLM, the adaptive length, ``--rpc`` in vLLM) is
said in :attr:`Export.notes`, with the nearest setting used instead; nothing is dropped silently.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from localspec.errors import SettingsError
from localspec.gguf.pairing import drafter_file_kind
from localspec.gguf.vocab import DRAFTER_FILES
from localspec.settings import DraftSettings

ENGINES = ("llama-server", "vllm")
#: localspec's n-gram lookup matches the last 4, then 3, then 2 tokens of the context.
NGRAM_LOOKUP = (2, 4)
#: The tokens llama-server's ngram-mod lookup matches (``--spec-ngram-mod-n-match``; llama.cpp's default).
NGRAM_MOD_MATCH = 24


@dataclass
class Export:
    """One engine's configuration: the command line, the speculative part alone, and what differs."""

    engine: str
    argv: list[str]
    speculative: dict[str, object] | list[str]
    notes: list[str] = field(default_factory=list)

    def command(self) -> str:
        """The command line, quoted for a POSIX shell."""
        return shlex.join(self.argv)


def _method(settings: DraftSettings, draft: Path | None, notes: list[str]) -> str:
    """The drafting method both engines have that stands for ``settings``'s model drafter or lookups:
    model, mtp, ngram, suffix or none (lookups chained before a model drafter: :func:`_chained`)."""
    kind = settings.strategy
    if not kind.drafts:
        return "none"
    drafter = drafter_file_kind(draft) if draft is not None else None
    if draft is not None and drafter and (kind.model or kind.routed or kind.mtp):
        what = DRAFTER_FILES[drafter]
        notes.append(f"{draft.name} is {what.what}: it drafts from the target's own rows ({what.spec_type})")
        return "mtp"
    if kind.routed:
        notes.append(
            "auto picks its drafters per request in localspec; an engine takes one setting: "
            "`localspec export` picks it from what this machine measured"
        )
        return "model" if draft else "suffix"
    if kind.mtp:
        return "mtp"
    if kind.model:
        if draft is None:
            raise SettingsError(f"strategy {kind.name} needs a draft model", hint="give --draft PATH")
        return "model"
    assert kind.lookup is not None
    return kind.lookup


def _chained(settings: DraftSettings) -> bool:
    """Lookups go before the model drafter (``model+ngram``, ``mtp+suffix``, ``auto`` with a draft)."""
    return settings.strategy.combined or settings.strategy.routed


def _ngram_mod(lookup_max: int) -> list[str]:
    """llama-server's ngram-mod lookup: the continuation of the context's match, up to ``lookup_max``
    tokens (it matches the last :data:`NGRAM_MOD_MATCH` tokens, llama.cpp's default)."""
    return ["--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", str(lookup_max)]


def llama_server(
    settings: DraftSettings,
    target: Path,
    draft: Path | None,
    *,
    n_ctx: int,
    threads: int,
    rpc: str | None = None,
    lookup_max: int | None = None,
) -> Export:
    """llama-server's flags for the pair and ``settings`` (the same draft length, p_min, threads, context).

    Args:
        settings: the drafting settings (a preset's ``[draft]``, or overridden); ``n_max`` is the draft
            length of the model drafter (the lookups' cap when lookups draft alone).
        target: the target GGUF.
        draft: the draft GGUF, if any.
        n_ctx: the context.
        threads: CPU threads (the draft's too).
        rpc: ``HOST:PORT,...`` rpc-servers for the target's layers (``--rpc``, all layers there).
        lookup_max: the longest lookup draft chained before the model drafter (default ``n_max``).

    Returns:
        The :class:`Export`; ``speculative`` holds the drafting flags alone.
    """
    notes: list[str] = []
    method = _method(settings, draft, notes)
    k = settings.n_max
    argv = ["llama-server", "--model", str(target), "-c", str(n_ctx), "--threads", str(threads)]
    if rpc:
        argv += ["--rpc", rpc, "-ngl", "999"]
    spec: list[str] = []
    chained = method in ("model", "mtp") and _chained(settings)
    lookup = ["ngram-mod"] if chained else []
    if chained and settings.uses_suffix:
        notes.append("llama-server has no suffix cache: ngram-mod, a lookup in the context, goes first")
    elif chained:
        notes.append("ngram-mod, llama-server's lookup in the context, goes first, as localspec's lookups do")
    if method == "model":
        assert draft is not None
        spec += ["--spec-type", ",".join([*lookup, "draft-simple"]), "--model-draft", str(draft)]
        spec += ["--spec-draft-n-max", str(k)]
        spec += ["--spec-draft-n-min", str(settings.n_min), "--spec-draft-p-min", f"{settings.p_min:g}"]
        spec += ["--spec-draft-threads", str(threads)]
        if rpc:
            spec += ["--spec-draft-ngl", "0"]
            notes.append("--spec-draft-ngl 0 keeps the draft on this machine's CPU, as localspec does")
    elif method == "mtp":
        drafter = drafter_file_kind(draft) if draft is not None else None
        spec_type = DRAFTER_FILES[drafter].spec_type if drafter else "draft-mtp"
        spec += ["--spec-type", ",".join([*lookup, spec_type]), "--spec-draft-n-max", str(k)]
        if drafter:  # a file of its own: a Gemma 4 assistant, an EAGLE-3 or DFlash drafter
            spec += ["--model-draft", str(draft)]
        spec += ["--spec-draft-n-min", str(settings.n_min), "--spec-draft-p-min", f"{settings.p_min:g}"]
    elif method == "suffix":
        notes.append("llama-server has no suffix cache: ngram-mod, a lookup in the context, is the nearest")
        spec += ["--spec-type", "ngram-mod", *_ngram_mod(k)]
    elif method == "ngram":
        spec += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(min(3, k))]
        spec += ["--spec-ngram-simple-size-m", str(k)]
    if chained:
        spec += _ngram_mod(lookup_max or k)
    if settings.adaptive and method in ("model", "mtp"):
        notes.append(
            f"llama-server drafts a fixed length ({k} here); localspec's adaptive controller sizes each "
            "round's draft"
        )
    return Export("llama-server", argv + spec, spec, notes)


def vllm(
    settings: DraftSettings, target: Path, draft: Path | None, *, n_ctx: int, rpc: str | None = None
) -> Export:
    """``vllm serve`` with the ``speculative_config`` that stands for ``settings``.

    Args:
        settings: the drafting settings.
        target: the target (a GGUF here; a Hugging Face repository id serves better in vLLM).
        draft: the draft, if any.
        n_ctx: the context (``--max-model-len``).
        rpc: llama.cpp's rpc-servers: not carried (vLLM spreads a model its own way); said in the notes.

    Returns:
        The :class:`Export`; ``speculative`` is the ``speculative_config`` dict.
    """
    notes = [
        "vLLM's GGUF loading is experimental: pass --tokenizer with the original Hugging Face repository, "
        "or serve the original (non-GGUF) weights of the same models"
    ]
    method = _method(settings, draft, notes)
    k = settings.n_max
    config: dict[str, object] = {}
    if method == "model":
        config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}
        if _chained(settings):
            notes.append(f"{settings.strategy.name}: vLLM takes one method; the draft model is kept")
    elif method == "mtp":
        config = {"method": "mtp", "num_speculative_tokens": k}
        if _chained(settings):
            notes.append(f"{settings.strategy.name}: vLLM takes one method; the MTP layers are kept")
        drafter = drafter_file_kind(draft) if draft is not None else None
        if drafter:
            notes.append(
                f"{DRAFTER_FILES[drafter].what} file: vLLM's support for it is not checked here; serve the "
                "original checkpoint with its drafter as vLLM's documentation for the family says"
            )
        notes.append(
            'vLLM runs the MTP layers of the original checkpoint; releases before "mtp" took a method per '
            'family ("qwen3_next_mtp", "deepseek_mtp", "glm4_moe_mtp")'
        )
    elif method == "ngram":
        low, high = NGRAM_LOOKUP
        config = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": low,
            "prompt_lookup_max": high,
        }
    elif method == "suffix":
        config = {"method": "suffix", "num_speculative_tokens": k}
    if settings.adaptive and method in ("model", "mtp"):
        notes.append(
            f"vLLM drafts a fixed length ({k} here); localspec's adaptive controller sizes each round's draft"
        )
    if rpc:
        notes.append(
            "--rpc is llama.cpp's: vLLM spreads a model over GPUs and machines with --tensor-parallel-size "
            "and --pipeline-parallel-size (a Ray cluster) instead"
        )
    argv = ["vllm", "serve", str(target), "--max-model-len", str(n_ctx)]
    if config:
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return Export("vllm", argv, config, notes)
