"""``Pipeline.compare``: the target alone and speculative on the same prompt, interleaved, in this process."""

from __future__ import annotations

import statistics
from typing import Any, Protocol

from localspec import constants
from localspec.decoding.stats import Comparison
from localspec.errors import SettingsError
from localspec.pipeline.results import GenerationResult
from localspec.settings import REPEATS_RANGE, DraftSettings, parse_strategy


class Compared(Protocol):
    """What :func:`compare` runs on: a :class:`localspec.pipeline.pipeline.Pipeline` (a protocol, so this
    module does not import the pipeline that calls it)."""

    settings: DraftSettings

    def tokenize(self, text: str) -> list[int]: ...

    def check_fits(self, n: int, max_tokens: int) -> None: ...

    def generate(self, prompt: str, **kwargs: Any) -> GenerationResult: ...


def compare(pipe: Compared, prompt: str, *, repeats: int = 1, warmup: bool = True, **kwargs) -> Comparison:
    """What :meth:`Pipeline.compare` returns: ``repeats`` runs of each side on ``pipe`` (after a short
    uncounted warm-up of each when ``warmup``), the speedup the ratio of their medians."""
    low, high = REPEATS_RANGE
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not low <= repeats <= high:
        raise SettingsError(
            f"repeats must be a whole number from {low} to {high}, got {repeats!r:.40}",
            hint="e.g. repeats=3 (each repeat runs both sides once more)",
        )
    kwargs.pop("baseline", None)
    strategy = kwargs.get("strategy")
    if not (pipe.settings.strategy if strategy is None else parse_strategy(strategy)).drafts:
        raise SettingsError(
            "nothing to compare: this runs the target alone, which is the other side already",
            hint="load a draft, or pass strategy='ngram' (or 'suffix') to compare prompt lookup",
        )
    max_tokens = kwargs.get("max_tokens", constants.DEFAULT_MAX_TOKENS)
    counted = isinstance(max_tokens, int) and not isinstance(max_tokens, bool)  # (else the run says)
    if counted:
        pipe.check_fits(len(pipe.tokenize(prompt)), max_tokens)  # the request's, not the warm-up's
    if warmup:
        short = {**kwargs, "max_tokens": min(8, max_tokens) if counted else max_tokens}
        pipe.generate(prompt, baseline=True, **short)
        pipe.generate(prompt, **short)
    base_runs, spec_runs = [], []
    for _ in range(repeats):
        base_runs.append(pipe.generate(prompt, baseline=True, **kwargs))
        spec_runs.append(pipe.generate(prompt, **kwargs))
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
