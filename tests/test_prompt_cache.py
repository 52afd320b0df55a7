"""The prompt cache: what a sequence held is kept when another request takes its place, and copied back for a
later request that starts the same way; the text is what a fresh evaluation gives, the cache keeps within its
budget, and a recurrent model's state serves only a context that starts with all of it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from _arch_models import write_model
from _dummy_runs import PROMPT
from _lossless import assert_lossless, traced_many
from _mtp_model import mtp_model

import localspec
from localspec.llama.prompt_cache import MIN_TOKENS, PromptCache

A = "def fibonacci(n):\n    # the n-th Fibonacci number, computed by iteration over the sequence\n" * 3
B = "class Stack:\n    # a last-in first-out stack of items kept in a list, with push and pop\n" * 3
C = "import os\n\n# walk a folder tree and print every file's size in bytes, sorted\n" * 3


def _traced(pipe, prompt, **kw):
    """Tokens (of a text or token ids) with the engine's per-token trace."""
    pipe.trace = trace = []
    try:
        return SimpleNamespace(tokens=[r.token for r in pipe.stream_tokens(prompt, **kw)]), trace
    finally:
        pipe.trace = None


def _cache(pipe) -> PromptCache:
    cache = pipe.target.prompt_cache
    assert cache is not None
    return cache


@pytest.mark.parametrize("draft", ["none", None])
def test_a_prompt_seen_before_is_copied_back_and_gives_the_same_text(draft):
    with localspec.load(draft=draft, suffix_store=False) as pipe:
        assert len(pipe.tokenize(A)) > 2 * MIN_TOKENS
        first = pipe.generate(A, max_tokens=16)
        pipe.generate(B, max_tokens=16)  # takes A's sequence: A's state is kept
        stats = _cache(pipe).stats
        assert (stats.saved, stats.restored) == (1, 0)
        again = pipe.generate(A, max_tokens=16)
        assert stats.restored == 1 and stats.restored_tokens >= len(pipe.tokenize(A)) - 1
        assert again.tokens == first.tokens
        assert again.stats.prompt_tokens == first.stats.prompt_tokens


def test_requests_in_a_batch_come_back_to_their_prompts():
    """Four prompts through two sequences, twice: the second time every prompt is copied back from the
    cache or its sequence, and every text is the first time's."""
    prompts = [A, B, C, A + B]
    with localspec.load(draft="none", parallel=2, suffix_store=False) as pipe:
        first = traced_many(pipe, prompts, max_tokens=12)
        restored = _cache(pipe).stats.restored
        second = traced_many(pipe, prompts, max_tokens=12)
        assert _cache(pipe).stats.restored >= restored + 2
        for a, a_trace, b, b_trace in zip(*first, *second, strict=True):
            assert_lossless(a, a_trace, b, b_trace)  # (the shared passes are not the first time's)


def test_the_cache_keeps_within_its_budget_least_recently_used_out():
    with localspec.load(draft="none", suffix_store=False) as pipe:
        pipe.generate(A, max_tokens=8)
        pipe.generate(B, max_tokens=8)
        one = _cache(pipe).nbytes
        assert one > 0
        pipe.target.prompt_cache = cache = PromptCache(budget=int(one * 1.5))
        for p in (A, B, C, A):
            pipe.generate(p, max_tokens=8)
        assert cache.stats.evicted >= 2 and len(cache.entries) == 1 and cache.nbytes <= cache.budget


def test_a_chats_next_turn_replaces_the_state_it_started_from():
    with localspec.load(draft="none", suffix_store=False) as pipe:
        pipe.generate(A, max_tokens=8)
        held = list(pipe.target.seq0.tokens)  # the prompt and the reply (its last token not yet in)
        pipe.generate(C, max_tokens=8)  # the first turn's state kept
        list(pipe.stream_tokens(held + pipe.tokenize(B)[1:], max_tokens=8))  # the next turn
        assert _cache(pipe).stats.restored == 1
        pipe.generate(C, max_tokens=8)  # the second turn's state kept: it serves the first's too
        kept = [e.tokens for e in _cache(pipe).entries]
        assert tuple(held) not in kept and any(e[: len(held)] == tuple(held) for e in kept)


def test_no_cache_when_turned_off():
    with localspec.load(draft="none", suffix_store=False, prompt_cache_mb=0) as pipe:
        assert pipe.target.prompt_cache is None
        assert pipe.generate(A, max_tokens=4).tokens


def test_a_recurrent_state_serves_only_a_context_that_starts_with_all_of_it(tmp_path):
    """A hybrid model's state cannot go back: a request on the same prompt evaluates it again, a chat's next
    turn (the whole earlier context, then more) continues from the copy, and both give a fresh run's text."""
    target = write_model(tmp_path, "qwen35", 1)
    other = [t + 3 for t in PROMPT] * 2
    kw = {"max_tokens": 12}

    def load(**extra):
        return localspec.load(target, "none", n_ctx=512, n_threads=2, suffix_store=False, **extra)

    with load() as pipe, load(prompt_cache_mb=0) as fresh:
        prompt = PROMPT * 2
        turn, turn_trace = _traced(pipe, prompt, **kw)
        list(pipe.stream_tokens(other, **kw))  # the first context's state is kept
        cache = _cache(pipe)
        assert cache.stats.saved == 1
        assert_lossless(turn, turn_trace, *_traced(pipe, prompt, **kw))  # not all of the entry: again
        assert cache.stats.restored == 0
        list(pipe.stream_tokens(other, **kw))
        follow = prompt + turn.tokens[:-1] + [t + 1 for t in PROMPT]
        got = _traced(pipe, follow, **kw)
        assert cache.stats.restored == 1
        assert_lossless(*_traced(fresh, follow, **kw), *got)


def test_a_model_whose_head_drafts_from_its_rows_keeps_no_prompt_cache(tmp_path):
    path = mtp_model(tmp_path, "token")
    with localspec.load(path, "none", strategy="mtp", n_ctx=256, n_threads=2, suffix_store=False) as pipe:
        assert pipe.target.prompt_cache is None
