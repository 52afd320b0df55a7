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
        on_cleanup_error: called with a generation and what failed while ending it (feeding the suffix
            cache, saving its store): the others go on. None: it is raised.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        width: int | None = None,
        fit: bool = True,
        on_end: Callable[[Generation], None] | None = None,
        on_cleanup_error: Callable[[Generation, Exception], None] | None = None,
    ) -> None:
        self.engine = engine
        self.width = max(1, min(width or len(engine.target.sequences), len(engine.target.sequences)))
        self.fit = fit
        self.on_end = on_end
        self.on_cleanup_error = on_cleanup_error
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

    def step(self, deliver: Callable[[StepEvent], None] | None = None) -> list[StepEvent]:
        """One step: the waiting generations that fit join, one pass runs over every running one, the finished
        ones end.

        A failure of the pass itself (a llama.cpp decode error, a closed pipeline) ends every generation that
        was in it, each with that error; a failure while one generation drafts or accepts ends that one
        alone.

        Args:
            deliver: called with each event before the finished generations are ended (their ending feeds
                the suffix cache and may save its store: a client need not wait for that).

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
            events = [
                StepEvent(g, out, g.finish is not None, g.error) for g, out in zip(gens, outs, strict=True)
            ]
        except Exception as exc:  # the shared pass failed: nobody in it can go on
            events = [StepEvent(g, [], True, exc) for g in gens]
        if deliver is not None:
            for event in events:
                deliver(event)
        for event in events:
            if event.done:
                self.running.remove(event.gen)
                self._end(event.gen)
        return events

    def _end(self, gen: Generation) -> None:
        try:
            self.engine.end(gen)
            if self.on_end is not None:
                self.on_end(gen)
        except Exception as exc:
            if self.on_cleanup_error is None:
                raise
            self.on_cleanup_error(gen, exc)
