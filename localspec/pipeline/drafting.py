"""Which drafter one generation of a :class:`~localspec.pipeline.pipeline.Pipeline` runs, built from its
settings: n-gram tables belong to that generation only; the suffix cache and the draft model are the
pipeline's (the engine's lock serialises their rounds, and each re-syncs to whichever context asks)."""

from __future__ import annotations

from collections.abc import Callable

from localspec.decoding.drafters import CombinedDrafter, Drafter, ModelDrafter, MtpDrafter, NgramDrafter
from localspec.errors import LocalspecError
from localspec.llama.runtime import Model
from localspec.settings import DraftSettings
from localspec.suffix.drafter import SuffixDrafter


def model_drafter(
    draft: Model | None, target: Model, masked_ids: list[int] | None, settings: DraftSettings
) -> ModelDrafter | None:
    """The pipeline's draft model drafter (None without a draft model): it never proposes ``masked_ids`` nor
    ids past the target's vocabulary; ``settings`` give its default ``n_min`` and ``p_min``."""
    if draft is None:
        return None
    return ModelDrafter(
        draft,
        target_n_vocab=target.n_vocab,
        masked_ids=masked_ids,
        n_min=settings.n_min,
        p_min=settings.p_min,
    )


def drafter_for(
    s: DraftSettings,
    target: Model,
    model: ModelDrafter | None,
    suffix: Callable[[], SuffixDrafter],
) -> Drafter | None:
    """The drafter of one generation with settings ``s`` (None: the target alone).

    Args:
        s: the generation's settings.
        target: the target (its MTP layers draft for an MTP strategy; they stop following its passes
            otherwise).
        model: the pipeline's draft model drafter (None: no draft model loaded).
        suffix: the pipeline's suffix cache drafter, for a strategy that uses it.

    Returns:
        A lookup drafter, a model drafter, or the two combined, as ``s.strategy`` says.

    Raises:
        LocalspecError: the strategy drafts with a model this pipeline did not load.
    """
    if not s.uses_mtp:  # the target's passes need not feed its MTP layers
        target.follow_mtp(False)
    if not s.is_speculative:
        return None
    # (the suffix cache: one generation's drafter over the pipeline's, so that a batch's requests keep their
    # own tables)
    lookup: Drafter = suffix().for_request() if s.uses_suffix else NgramDrafter()
    if s.uses_mtp:
        mtp = _mtp_drafter(s, target)
        return CombinedDrafter(mtp, lookup) if s.strategy.combined else mtp
    if not s.uses_model:
        return lookup
    if model is None:
        raise LocalspecError(
            f"strategy {s.strategy.name!r} needs a draft model, and this pipeline has none",
            hint="load with a draft model (draft=PATH; on the command line --draft PATH) or a preset "
            "with one, or use strategy 'suffix' or 'ngram'",
        )
    limited = model.with_limits(n_min=s.n_min, p_min=s.p_min)
    return CombinedDrafter(limited, lookup) if s.strategy.combined else limited


def _mtp_drafter(s: DraftSettings, target: Model) -> MtpDrafter:
    """The target's MTP layers as the drafter of ``s`` (loaded with the target for an MTP strategy)."""
    if target.mtp is None:
        raise LocalspecError(
            f"strategy {s.strategy.name!r} drafts with the target's MTP layers, and this pipeline was "
            "loaded without them",
            hint="load with strategy='mtp' (on the command line --strategy mtp) to load them",
        )
    return MtpDrafter(target, n_min=s.n_min, p_min=s.p_min)
