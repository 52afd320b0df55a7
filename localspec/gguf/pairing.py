"""The one pair check: are a target and a draft usable, and do their vocabularies fit (from headers only)?

Everything that pairs models (``load``, presets, downloads) calls :func:`check_pair`, so a verdict is
computed once and carried along in a :class:`PairInfo`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from localspec.errors import IncompatiblePairError, LocalspecError, UnusableModelError


@dataclass
class PairInfo:
    target_path: Path
    draft_path: Path | None
    verdict: str | None = None
    reasons: list[str] = field(default_factory=list)
    note: str = ""
    masked_ids: list[int] = field(default_factory=list)
    n_ctx_train: int | None = None  # the target's trained context (its header), when it says
    #: Things about the pair worth a word that do not refuse it (see :func:`size_warning`).
    warnings: list[str] = field(default_factory=list)
    #: the draft is a drafter file (:data:`localspec.gguf.vocab.DRAFTER_FILES`): an MTP assistant (Gemma 4's),
    #: an EAGLE-3 or a DFlash drafter. It drafts as the target's MTP layers do (``--strategy mtp``), reading
    #: the target's KV cache or layer rows, instead of running as a model of its own.
    assistant: bool = False


#: How the verdict's last reason for an incompatible pair begins: the advice that the refusal's hint gives
#: (``localspec pair`` shows it among the reasons; a refusal says it once, as its hint).
_VERDICT_ADVICE = "pick a draft whose vocabulary matches"

#: The first (or a later) part of a model split into shards: its file is only part of the model's size.
_SHARD = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


#: How the two models are meant to be given, for the "swapped?" line (``pair`` names its arguments).
_ORDER = "the target is the large model, the draft the small one"


def size_warning(target_bytes: int | None, draft_bytes: int | None, *, order: str = _ORDER) -> str | None:
    """A line when the draft file is not smaller than the target's (the arguments swapped, most often):
    such a draft costs as much per token as the target, so drafting cannot pay. None when it is smaller
    or a size is unknown. The vocabulary verdict does not depend on it. ``order`` says which way round
    the two models go."""
    from localspec.units import format_bytes

    if not target_bytes or not draft_bytes or draft_bytes < target_bytes:
        return None
    sizes = f"the draft ({format_bytes(draft_bytes)}) is"
    if draft_bytes <= target_bytes * 1.05:  # (equal as printed: "1.8 MB is larger than 1.8 MB" read oddly)
        return f"{sizes} about as large as the target: a draft only pays when it is much smaller"
    return (
        f"{sizes} larger than the target ({format_bytes(target_bytes)}): the arguments may be swapped "
        f"({order})"
    )


def file_size_warning(target: Path | str, draft: Path | str, *, order: str = _ORDER) -> str | None:
    """:func:`size_warning` from the two files' sizes (none for a model split into shards)."""
    return size_warning(_file_bytes(Path(target)), _file_bytes(Path(draft)), order=order)


def _file_bytes(path: Path) -> int | None:
    """The file's size, or None for a shard (the model is larger than the file) or a file that cannot be
    read."""
    if _SHARD.search(path.name):
        return None
    try:
        return path.stat().st_size
    except OSError:
        return None


def usable_metadata(path: Path, role: str, hint: str):
    """The header of ``path`` (no merges: pairing does not need them), refused when it cannot run here as
    ``role`` (``"target"`` or ``"draft"``)."""
    from localspec.gguf.meta import read_metadata
    from localspec.gguf.vocab import usability

    meta = read_metadata(path, merges=False)
    ok, why = usability(meta, role=role)
    if not ok:
        raise UnusableModelError(f"{path}: cannot be used as a {role}: {why}", hint=hint)
    return meta


def check_pair(target: Path, draft: Path | None, *, label: str = "") -> PairInfo:
    """Read both headers, refuse unusable files and incompatible vocabularies before loading.

    ``label`` (e.g. ``"preset 'qwen3'"``) prefixes the error messages. The one pair check: the API, presets
    and downloads all call this.
    """
    from localspec.gguf.vocab import compare, fingerprint

    t_meta = usable_metadata(target, "target", "pick a complete, text-only GGUF model as the target")
    info = PairInfo(target_path=target, draft_path=draft, n_ctx_train=_trained_context(t_meta))
    if draft is None:
        return info
    d_meta = usable_metadata(
        draft, "draft", "pick a complete, text-only GGUF model as the draft, or use --draft ngram"
    )
    info.assistant = _check_assistant(t_meta, d_meta, draft, label)
    verdict = compare(fingerprint(t_meta), fingerprint(d_meta))
    if not verdict.usable:
        raise IncompatiblePairError(
            f"{label + ': ' if label else ''}draft {draft.name} does not fit target {target.name}: "
            "vocabularies are incompatible",
            reasons=[r for r in verdict.reasons if not r.startswith(_VERDICT_ADVICE)],
            hint="pick another draft (`localspec pair TARGET` lists those that fit), or use --draft ngram",
        )
    info.verdict, info.reasons, info.masked_ids = (
        verdict.verdict,
        list(verdict.reasons),
        list(verdict.masked_ids),
    )
    warning = file_size_warning(target, draft)
    if warning:
        info.warnings.append(warning)
    return info


def drafter_file_kind(path: Path) -> str | None:
    """The architecture of ``path`` when it is a drafter file (:data:`localspec.gguf.vocab.DRAFTER_FILES`:
    ``gemma4-assistant``, ``eagle3``, ``dflash``) by its header; None for any other file, and for one whose
    header cannot be read (:func:`check_pair` says why)."""
    from localspec.gguf.meta import read_metadata
    from localspec.gguf.vocab import DRAFTER_FILES

    try:
        arch = read_metadata(path, merges=False).architecture or ""
    except LocalspecError:
        return None
    return arch if arch in DRAFTER_FILES else None


def _check_assistant(t_meta, d_meta, draft: Path, label: str) -> bool:
    """Whether the draft is a drafter file (:data:`localspec.gguf.vocab.DRAFTER_FILES`); one that does not
    fit the target is refused (:func:`localspec.gguf.vocab.drafter_misfit`)."""
    from localspec.gguf.vocab import DRAFTER_FILES, drafter_misfit

    if (d_meta.architecture or "") not in DRAFTER_FILES:
        return False
    problem = drafter_misfit(t_meta, d_meta)
    if problem:
        target = t_meta.name or "this target"
        raise IncompatiblePairError(
            f"{label + ': ' if label else ''}draft {draft.name} does not fit target {target}: {problem}",
            hint="use the drafter published with this target model, or a small model of its family",
        )
    return True


def _trained_context(meta) -> int | None:
    """``<arch>.context_length`` from a header, when it is a positive whole number."""
    value = meta.get(f"{meta.architecture}.context_length")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
