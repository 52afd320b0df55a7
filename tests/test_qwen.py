"""The real Qwen2.5-Coder 1.5B target + 0.5B draft through llama.cpp (opt-in: LOCALSPEC_QWEN_DIR).

python scripts/fetch_qwen_pair.py models && LOCALSPEC_QWEN_DIR=models python -m pytest -q -m qwen
"""

from __future__ import annotations

import numpy as np
import pytest
from _lossless import assert_lossless, traced
from conftest import QWEN_DRAFT, QWEN_TARGET, qwen_dir

import localspec
from localspec.llama import sampling
from localspec.llama.sampling import SamplingParams

pytestmark = [pytest.mark.qwen, pytest.mark.slow]

EDIT = (
    "Rename the variable `total` to `acc` in this function and change nothing else:\n\n"
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n"
)
PROMPTS = [
    "def quicksort(xs):\n",
    [{"role": "user", "content": EDIT}],
    [{"role": "user", "content": "In two sentences, why is the sky blue?"}],
]


@pytest.fixture(scope="module")
def qwen():
    d = qwen_dir()
    pipe = localspec.load(target=d / QWEN_TARGET, draft=d / QWEN_DRAFT, n_threads=2, n_ctx=2048)
    yield pipe
    pipe.close()


def test_pair_is_identical_and_loaded(qwen):
    assert qwen.info.verdict == "identical"
    m = qwen.memory
    assert m.target_weights_bytes > 2 * m.draft_weights_bytes > 0
    assert m.draft_kv_bytes > 0 and m.rss_after_draft_bytes > m.rss_after_target_bytes


@pytest.mark.parametrize("strategy", ["model", "ngram"])
def test_greedy_is_lossless_on_the_real_pair(qwen, strategy):
    drafted = accepted = 0
    for prompt in PROMPTS:
        base, bt = traced(qwen, prompt, max_tokens=48, baseline=True)
        spec, st = traced(qwen, prompt, max_tokens=48, strategy=strategy, n_max=4, p_min=0.0)
        assert_lossless(base, bt, spec, st)
        drafted += spec.stats.drafted
        accepted += spec.stats.accepted
    assert drafted > 0 and accepted > 0, "nothing was drafted or accepted: the test would prove nothing"


def test_adaptive_greedy_is_lossless(qwen):
    base, bt = traced(qwen, PROMPTS[1], max_tokens=64, baseline=True)
    spec, st = traced(qwen, PROMPTS[1], max_tokens=64, strategy="model+ngram", adaptive=True, n_max=6)
    assert_lossless(base, bt, spec, st)


def test_rejection_sampling_keeps_the_target_distribution_on_real_rows(qwen):
    """The acceptance rule on the real 151,936-token rows of both models at one position."""
    tokens = qwen.tokenize("def quicksort(xs):\n    if len(xs) <= 1:\n        return")
    params = SamplingParams(temperature=0.9, top_p=0.95)
    t, d = qwen.target, qwen.draft
    rows = []
    for m in (t, d):
        m.decode(m.sync(tokens, keep_last=1))
        rows.append(np.array(m.decode_logits(tokens[-1:], outputs=1)[0]))
        m.reset()  # the engine re-syncs its caches on the next call
    p, q = (sampling.distribution(r, params) for r in rows)
    assert 0.01 < 0.5 * np.abs(p - q).sum() < 0.99, "target and draft rows should differ, but not wholly"
    rng = np.random.default_rng(7)
    n = 20000
    out = np.zeros_like(p)
    for _ in range(n):
        _, tok = sampling.accept_or_resample(p, q, sampling.sample(q, rng), rng)
        out[tok] += 1
    out /= n
    top = np.argsort(-p)[:20]
    # binomial standard error at most 0.0036 for n=20000: 0.015 is over four of them
    assert np.abs(out[top] - p[top]).max() < 0.015


@pytest.mark.parametrize("strategy", ["suffix", "model+suffix"])
def test_suffix_cache_is_lossless_on_the_real_pair(qwen, strategy):
    """Suffix drafts (from the prompt and, on the second pass, from the first pass's request) keep every
    emitted token the verifying pass's argmax on the real 151,936-token vocabulary."""
    qwen.reset_suffix()
    drafted_history = 0
    for _ in range(2):  # the second pass drafts from what the first one wrote
        for prompt in PROMPTS[:2]:
            base, bt = traced(qwen, prompt, max_tokens=48, baseline=True)
            spec, st = traced(qwen, prompt, max_tokens=48, strategy=strategy, n_max=32)
            assert_lossless(base, bt, spec, st)
            drafted_history += spec.stats.drafted_by_source.get("history", 0)
    assert drafted_history > 0, "nothing was drafted from earlier requests: the test would prove nothing"


def test_a_json_schema_reply_is_lossless_and_valid_with_every_drafter(qwen):
    """The real 151,936-token vocabulary under a schema's grammar: each token is the best one the grammar
    allows (the trace checks every position against a full mask), the reply parses and fits the schema."""
    import json

    fmt = {
        "type": "json_schema",
        "json_schema": {
            "name": "cat",
            "schema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer"},
                    "toys": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                },
                "required": ["name", "age", "toys"],
            },
        },
    }
    messages = [{"role": "user", "content": "Describe a cat named Tom, age 3, with two toys."}]
    kw = dict(max_tokens=80, response_format=fmt)
    base, bt = traced(qwen, messages, baseline=True, **kw)
    cat = json.loads(str(base))
    assert set(cat) == {"name", "age", "toys"} and isinstance(cat["age"], int) and len(cat["toys"]) <= 3
    for strategy in ("model", "suffix", "suffix"):  # the second suffix run drafts from the first's reply
        spec, st = traced(qwen, messages, strategy=strategy, **kw)
        assert_lossless(base, bt, spec, st)
    assert spec.stats.drafted > 0 and spec.stats.accepted > 0
