"""Several prompts at once through one pipeline (:meth:`Pipeline.generate_many`): a batch stepped until every
prompt is done, each prompt's tokens collected (and handed to a callback) in order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from localspec import constants
from localspec.decoding.batch import Batch
from localspec.decoding.engine import Generation, TokenResponse
from localspec.errors import SettingsError
from localspec.llama.sampling import SamplingParams
from localspec.pipeline.results import GenerationResult, collect


class Runs(Protocol):
    """What :func:`generate_many` uses of a :class:`~localspec.pipeline.pipeline.Pipeline` (a protocol: the
    pipeline imports this module)."""

    trace: list[tuple[int, bool, int, float]] | None

    def tokenize(self, text: str) -> list[int]: ...

    def start_tokens(self, tokens: list[int], **kwargs: Any) -> Generation: ...

    def batch(self) -> Batch: ...


#: :meth:`Pipeline.stream_tokens`'s sampling arguments, in :class:`SamplingParams`' order.
SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed")
#: Its other arguments, with their defaults.
DEFAULTS: dict[str, Any] = {
    "max_tokens": constants.DEFAULT_MAX_TOKENS,
    "baseline": False,
    **dict.fromkeys(("stop", "strategy", "grammar", "n_max", "n_min", "p_min", "adaptive")),
}


def start_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """:meth:`Pipeline.stream_tokens`'s keyword arguments as a generation's start takes them: the sampling
    ones made into :class:`SamplingParams`, the ones not given at their defaults.

    Args:
        kwargs: the caller's keyword arguments (consumed).

    Returns:
        Every argument of the start, ``params`` included.

    Raises:
        SettingsError: an argument :meth:`Pipeline.stream_tokens` does not take.
    """
    unknown = sorted(set(kwargs) - set(DEFAULTS) - set(SAMPLING))
    if unknown:
        raise SettingsError(
            f"unknown argument(s): {', '.join(unknown)}", hint="see help(Pipeline.stream_tokens)"
        )
    blank = SamplingParams()
    params = SamplingParams(*(kwargs.pop(k, getattr(blank, k)) for k in SAMPLING))
    return {**DEFAULTS, **kwargs, "params": params}


def generate_many(
    pipe: Runs,
    prompts: Sequence[str],
    on_token: Callable[[int, TokenResponse], None] | None,
    kwargs: dict[str, Any],
) -> list[GenerationResult]:
    """:meth:`Pipeline.generate_many`: every prompt checked and started first (a bad one fails the call
    before anything runs), then one batch stepped until all are done.

    Args:
        pipe: the pipeline.
        prompts: the texts to continue.
        on_token: called with each prompt's index and token as it comes.
        kwargs: :meth:`Pipeline.stream_tokens`'s keyword arguments, for every prompt.

    Returns:
        One result per prompt, in order.
    """
    if isinstance(prompts, str):
        raise SettingsError(
            "generate_many takes a list of prompts, got one string", hint="use generate() for one prompt"
        )
    gens = [pipe.start_tokens(pipe.tokenize(p), **kwargs) for p in prompts]
    out: list[list[TokenResponse]] = [[] for _ in gens]
    order = {id(g): i for i, g in enumerate(gens)}
    traced = pipe.trace
    if traced is not None:
        for gen in gens:
            gen.trace = []  # each its own, joined in the prompts' order at the end
    batch = pipe.batch()
    for gen in gens:
        batch.add(gen)
    try:
        while not batch.idle:
            for event in batch.step():
                if event.error is not None:
                    raise event.error
                i = order[id(event.gen)]
                out[i] += event.tokens
                for r in event.tokens if on_token is not None else ():
                    on_token(i, r)  # type: ignore[misc]
    finally:
        for gen in [*batch.running, *batch.waiting]:
            batch.cancel(gen)
        if traced is not None:
            for gen in gens:
                traced.extend(gen.trace or [])
    return [collect(iter(tokens)) for tokens in out]
