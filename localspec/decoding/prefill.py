"""Chunked prefill beside running generations: how much of a new prompt a step takes on, and its draft
model reading the prompt as the target does (so that beginning leaves it one chunk, not a whole prompt)."""

from __future__ import annotations

import time

from localspec.decoding.drafters import Drafter, draft_model_of
from localspec.decoding.pass_costs import PassCosts

#: The most prompt tokens evaluated in one step beside running generations (chunked prefill); fewer when
#: the measured cost of a pass says so (:data:`PREFILL_SLOWDOWN`).
PREFILL_CHUNK = 256
#: A step that carries a prompt chunk beside running generations costs at most this many times the step
#: without it, by the measured cost of a pass of each width: their next token comes at most that much later
#: (the long prompt's own first token comes later instead).
PREFILL_SLOWDOWN = 2.0
#: The fewest prompt tokens a step carries beside running generations: a prompt always moves on. (On a
#: 2-core CPU a prompt row of a 1.5B model costs about a fifth of a 3-request step: a few rows is all that
#: keeps that step within :data:`PREFILL_SLOWDOWN`.)
PREFILL_MIN = 4


def prompt_room(costs: PassCosts, width: int, drafters: list[Drafter | None]) -> int:
    """Prompt tokens a pass of ``width`` rows may carry besides (:meth:`PassCosts.room`).

    Args:
        costs: the passes measured so far.
        width: the running rounds' rows.
        drafters: those of the generations whose prompts go in: half the allowance when a draft model
            reads the same tokens in the step (:func:`keep_pace`).

    Returns:
        The tokens.
    """
    slowdown = PREFILL_SLOWDOWN
    if any(draft_model_of(d) is not None for d in drafters):
        slowdown = 1.0 + (PREFILL_SLOWDOWN - 1.0) / 2
    return costs.room(width, slowdown, least=PREFILL_MIN, most=PREFILL_CHUNK)


def keep_pace(drafter: Drafter | None, seq_id: int, done: list[int]) -> float:
    """While a prompt goes in by chunks, its draft model (if it drafts with one) reads it as far as the
    target has: the part it had not read yet.

    Args:
        drafter: the generation's drafter.
        seq_id: its sequence.
        done: the prompt tokens the target holds.

    Returns:
        The seconds it took.
    """
    model = draft_model_of(drafter)
    if model is None:
        return 0.0
    t0 = time.perf_counter()
    model.use_sequence(seq_id)
    model.begin(done)
    return time.perf_counter() - t0
