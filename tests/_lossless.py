"""Greedy losslessness, checked token by token against the target's own verifying pass."""

from __future__ import annotations

# llama.cpp's batched and one-token passes may differ in the last bits; a greedy choice can only
# flip where the top two logits are this close (measured on Qwen 1.5B: a 0.021 margin flipped).
NEAR_TIE = 0.05


def traced(pipe, prompt, **kw):
    """Generate (a str prompt) or chat (a list of messages) with the engine's per-token trace on."""
    pipe.trace = trace = []
    try:
        result = pipe.chat(prompt, **kw) if isinstance(prompt, list) else pipe.generate(prompt, **kw)
        return result, trace
    finally:
        pipe.trace = None


def traced_many(pipe, prompts, **kw):
    """:meth:`Pipeline.generate_many` with the engine's per-token trace on: the results, and each one's trace
    rows."""
    pipe.trace = trace = []
    try:
        results = pipe.generate_many(prompts, **kw)
    finally:
        pipe.trace = None
    rows, at = [], 0
    for r in results:  # the trace holds each prompt's rows in turn
        rows.append(trace[at : at + len(r.tokens)])
        at += len(r.tokens)
    return results, rows


def assert_lossless(base, base_trace, spec, spec_trace):
    """Token-identical, or diverging only where the target's top-2 margin is a near-tie."""
    for tok, _, argmax, _ in spec_trace:
        assert tok == argmax, "every emitted token must be the verifying pass's argmax"
    n = min(len(base.tokens), len(spec.tokens))
    for i in range(n):
        if base.tokens[i] != spec.tokens[i]:
            margin = min(base_trace[i][3], spec_trace[i][3])
            assert margin < NEAR_TIE, f"diverged at token {i} with a clear margin {margin:.3f}"
            return
    assert base.tokens == spec.tokens
