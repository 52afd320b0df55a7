"""The one pair check: are a target and a draft usable, and do their vocabularies fit (from headers only)?

Everything that pairs models (``load``, presets, downloads) calls :func:`check_pair`, so a verdict is
computed once and carried along in a :class:`PairInfo`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localspec.errors import IncompatiblePairError, UnusableModelError


@dataclass
class PairInfo:
    target_path: Path
    draft_path: Path | None
    verdict: str | None = None
    reasons: list[str] = field(default_factory=list)
    note: str = ""
    masked_ids: list[int] = field(default_factory=list)
    n_ctx_train: int | None = None  # the target's trained context (its header), when it says


def usable_metadata(path: Path, role: str, hint: str):
    """The header of ``path`` (no merges: pairing does not need them), refused when it cannot run here."""
    from localspec.gguf_meta import read_metadata
    from localspec.vocab import usability

    meta = read_metadata(path, merges=False)
    ok, why = usability(meta)
    if not ok:
        raise UnusableModelError(f"{path}: cannot be used as a {role}: {why}", hint=hint)
    return meta


def check_pair(target: Path, draft: Path | None, *, label: str = "") -> PairInfo:
    """Read both headers, refuse unusable files and incompatible vocabularies before loading.

    ``label`` (e.g. ``"preset 'qwen3'"``) prefixes the error messages. The one pair check: the API, presets
    and downloads all call this.
    """
    from localspec.vocab import compare, fingerprint

    t_meta = usable_metadata(target, "target", "pick a complete, text-only GGUF model as the target")
    info = PairInfo(target_path=target, draft_path=draft, n_ctx_train=_trained_context(t_meta))
    if draft is None:
        return info
    d_meta = usable_metadata(
        draft, "draft", "pick a complete, text-only GGUF model as the draft, or use --draft ngram"
    )
    verdict = compare(fingerprint(t_meta), fingerprint(d_meta))
    if not verdict.usable:
        raise IncompatiblePairError(
            f"{label + ': ' if label else ''}draft {draft.name} does not fit target {target.name}: "
            "vocabularies are incompatible",
            reasons=list(verdict.reasons),
            hint="pick another draft (`localspec pair TARGET` lists those that fit), or use --draft ngram",
        )
    info.verdict, info.reasons, info.masked_ids = (
        verdict.verdict,
        list(verdict.reasons),
        list(verdict.masked_ids),
    )
    return info


def _trained_context(meta) -> int | None:
    """``<arch>.context_length`` from a header, when it is a positive whole number."""
    value = meta.get(f"{meta.architecture}.context_length")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
