"""Many generations at once on one engine: each step is ONE target pass over every running sequence.

A :class:`Batch` holds the generations that run together (at most one per sequence of the target: the
pipeline's ``parallel``) and the ones waiting for a sequence, in arrival order. Each :meth:`Batch.step` runs
:meth:`~localspec.decoding.engine.Engine.step` over the running ones: every sequence adds its pending token
and its draft to one pass, a new request's prompt goes in by chunks in the same passes (a long prompt delays
the others by one chunk at most), and each draft is cut to what pays for its rows in a pass that is no longer
free (:func:`localspec.decoding.speed.batch_lengths`). A finished or cancelled generation is ended at once
(:meth:`~localspec.decoding.engine.Engine.end`: its sequence back to what it accepted) and frees its
sequence for the next waiting one.

One batch is driven by one thread at a time (the serve worker's, or a :meth:`Pipeline.generate_many` call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localspec.decoding.engine import Engine, Generation, TokenResponse


@dataclass(frozen=True)
class StepEvent:
    """What one step did for one generation: the tokens it emitted (none while its prompt goes in), or the
    error that ended it; ``done`` once it is over (finished, failed or cancelled)."""

    gen: Generation
    tokens: list[TokenResponse]
    done: bool
    error: BaseException | None = None


class Batch:
    """Generations stepped together (see the module docstring).

    Args:
        engine: the engine of the target they run on.
        width: the most generations running at once (default: the target's sequences).
        fit: choose the draft lengths for the whole pass (False: each drafter's own lengths, as alone).
        on_end: called with each generation once it is over (after the engine ended it).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        width: int | None = None,
        fit: bool = True,
        on_end: Callable[[Generation], None] | None = None,
    ) -> None:
        self.engine = engine
        self.width = max(1, min(width or len(engine.target.sequences), len(engine.target.sequences)))
        self.fit = fit
        self.on_end = on_end
        self.running: list[Generation] = []
        self.waiting: list[Generation] = []

    def add(self, gen: Generation) -> None:
        """Queue ``gen`` (from :meth:`Engine.start`): it runs from the next step with a sequence for it."""
        self.waiting.append(gen)

    @property
    def idle(self) -> bool:
        """Nothing running and nothing waiting."""
        return not self.running and not self.waiting

    def cancel(self, gen: Generation) -> None:
        """End ``gen`` now (its sequence keeps what it accepted and is free for the next request)."""
        if gen in self.waiting:
            self.waiting.remove(gen)
            self._end(gen)
        elif gen in self.running:
            self.running.remove(gen)
            self._end(gen)

    def step(self) -> list[StepEvent]:
        """One step: the waiting generations that fit join, one pass runs over every running one, the finished
        ones end.

        A failure of the pass itself (a llama.cpp decode error, a closed pipeline) ends every generation that
        was in it, each with that error; a failure while one generation drafts or accepts ends that one
        alone.

        Returns:
            One event per generation that was in the step.
        """
        while self.waiting and len(self.running) < self.width:
            self.running.append(self.waiting.pop(0))
        gens = list(self.running)
        if not gens:
            return []
        try:
            outs = self.engine.step(gens, fit=self.fit)
        except Exception as exc:  # the shared pass failed: nobody in it can go on
            for gen in gens:
                self.running.remove(gen)
                self._end(gen)
            return [StepEvent(gen, [], True, exc) for gen in gens]
        events = []
        for gen, out in zip(gens, outs, strict=True):
            done = gen.finish is not None
            if done:
                self.running.remove(gen)
                self._end(gen)
            events.append(StepEvent(gen, out, done, gen.error))
        return events

    def _end(self, gen: Generation) -> None:
        self.engine.end(gen)
        if self.on_end is not None:
            self.on_end(gen)
