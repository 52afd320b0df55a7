"""Chunked prefill beside running generations: how much of a new prompt a step takes on, and its draft
model reading the prompt as the target does (so that beginning leaves it one chunk, not a whole prompt)."""

from __future__ import annotations

import time

from localspec.decoding.drafters import Drafter, draft_model_of

#: The most prompt tokens evaluated in one step beside running generations (chunked prefill): a long prompt
#: delays their tokens by about one such chunk's time. (Chunks sized to keep a step within twice its cost
#: were measured: on a 2-core CPU, where a prompt row costs a fifth of a 3-request step, they left a few
#: tokens a step, and serve's throughput under 4-8 clients fell by a third.)
PREFILL_CHUNK = 256


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
