"""Greedy runs over the 128-token dummy vocabulary of test-llama-archs models (the hybrid and MTP tests)."""

from __future__ import annotations

#: A prompt of the dummy vocabulary's ids that repeats, so lookups find what follows.
PROMPT = [1, 5, 9, 17, 33, 2, 7, 60, 61, 62, 5, 9, 17, 33, 2, 7, 60, 61, 62, 5, 9]
MAX_TOKENS = 40


def argmax_run(pipe, strategy, **kw):
    """``PROMPT`` continued greedily with ``strategy``, every emitted token checked to be the verifying
    pass's argmax; the token ids and the generation's stats."""
    pipe.trace = trace = []
    try:
        out = list(pipe.stream_tokens(PROMPT, max_tokens=MAX_TOKENS, strategy=strategy, **kw))
    finally:
        pipe.trace = None
    assert trace and all(tok == argmax for tok, _, argmax, _ in trace), (
        f"{strategy}: every emitted token must be the verifying pass's argmax"
    )
    return [r.token for r in out], out[-1].stats


def first_position_rate(stats) -> float:
    """The share of first draft positions the target accepted."""
    return stats.accepted_by_position[0] / max(1, stats.drafted_by_position[0])
