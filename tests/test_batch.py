"""Many generations at once: one target pass per step over every running sequence, each request lossless as it
runs alone, a cancelled or failing one ending alone, drafts cut where a shared pass stops being free."""

from __future__ import annotations

import math

import pytest
from _arch_models import write_model
from _dummy_runs import MAX_TOKENS, PROMPT
from _lossless import NEAR_TIE, traced_many

import localspec
from localspec import constants
from localspec.decoding.draft import Draft
from localspec.decoding.engine import Engine
from localspec.decoding.pass_costs import PassCosts
from localspec.decoding.speed import batch_lengths
from localspec.errors import LocalspecError, SettingsError
from localspec.llama.loading import check_sequences
from localspec.llama.runtime import Model
from localspec.llama.sampling import SamplingParams
from localspec.pipeline import models as pipeline_module
from localspec.settings import DraftSettings

PROMPTS = ["def fib(n):", "class Stack:", "import os\n\ndef main():", "# sort a list\n", "def add(a, b):"]


@pytest.fixture(scope="module")
def pipe3():
    with localspec.load(parallel=3, suffix_store=False) as pipe:
        yield pipe


def _traced_alone(pipe, prompt, **kw):
    pipe.trace = trace = []
    try:
        return pipe.generate(prompt, **kw), trace
    finally:
        pipe.trace = None


def _assert_same_as_alone(alone, alone_trace, many, many_trace, what):
    """Token lists: identical, or diverging only at a near-tie the traces show."""
    for tok, _, argmax, _ in many_trace:
        assert tok == argmax, f"{what}: every emitted token must be its verifying pass's argmax"
    for i, (a, b) in enumerate(zip(alone, many, strict=False)):
        if a != b:  # a batched pass may differ in the last bits: only a near-tie may flip
            margin = min(alone_trace[i][3], many_trace[i][3])
            assert margin < NEAR_TIE, f"{what}: diverged at token {i} with a clear margin {margin:.3f}"
            return
    assert alone == many, what


def _batched(pipe, prompts, *, fit, **kw):
    """``prompts`` run together in one batch: each one's tokens and trace rows."""
    batch = pipe.batch(fit=fit)
    gens = [pipe.start_tokens(pipe.tokenize(p), **kw) for p in prompts]
    tokens: dict[int, list[int]] = {id(g): [] for g in gens}
    for gen in gens:
        gen.trace = []
        batch.add(gen)
    while not batch.idle:
        for event in batch.step():
            assert event.error is None
            tokens[id(event.gen)] += [r.token for r in event.tokens]
    return [(tokens[id(g)], g.trace, g.stats) for g in gens]


@pytest.mark.parametrize("strategy", ["none", "ngram", "model", "model+suffix"])
def test_each_request_of_a_batch_is_what_it_gives_alone(pipe3, strategy):
    """Five prompts on three sequences (two wait for a free one), greedy: each text is the one its prompt
    gives alone, and every token is the argmax of the pass that verified it; with every draft verified
    (drafts taken back at different positions in one pass) and with drafts cut to what pays."""
    kw = {"max_tokens": 32, "strategy": strategy}
    alone = [_traced_alone(pipe3, p, **kw) for p in PROMPTS]
    for fit in (False, True):
        many = _batched(pipe3, PROMPTS, fit=fit, **kw)
        for prompt, (a, a_trace), (tokens, trace, _) in zip(PROMPTS, alone, many, strict=True):
            _assert_same_as_alone(a.tokens, a_trace, tokens, trace, f"{strategy} fit={fit} {prompt!r}")
        if strategy != "none" and not fit:
            assert sum(stats.drafted for _, _, stats in many) > 0


def test_generate_many_gives_each_prompts_text_in_order(pipe3):
    many, many_trace = traced_many(pipe3, PROMPTS, max_tokens=16, strategy="ngram")
    assert len(many) == len(PROMPTS)
    for prompt, result, rows in zip(PROMPTS, many, many_trace, strict=True):
        alone, alone_trace = _traced_alone(pipe3, prompt, max_tokens=16, strategy="ngram")
        _assert_same_as_alone(alone.tokens, alone_trace, result.tokens, rows, repr(prompt))


def test_tokens_stream_to_the_callback_in_order(pipe3):
    seen: dict[int, list[int]] = {}
    many = pipe3.generate_many(
        PROMPTS[:3], max_tokens=12, on_token=lambda i, r: seen.setdefault(i, []).append(r.token)
    )
    assert {i: toks for i, toks in seen.items()} == {i: r.tokens for i, r in enumerate(many)}


def test_a_cancelled_request_frees_its_sequence_and_changes_nobody_elses_text(pipe3):
    alone = [pipe3.generate(p, max_tokens=24, strategy="ngram") for p in PROMPTS[:4]]
    batch = pipe3.batch()
    gens = [pipe3.start_tokens(pipe3.tokenize(p), max_tokens=24, strategy="ngram") for p in PROMPTS[:3]]
    for gen in gens:
        batch.add(gen)
    got: dict[int, list[int]] = {id(g): [] for g in gens}
    for _ in range(3):
        for event in batch.step():
            got[id(event.gen)] += [r.token for r in event.tokens]
    batch.cancel(gens[1])
    assert gens[1].stats.finish_reason == "cancelled" and len(batch.running) == 2
    late = pipe3.start_tokens(pipe3.tokenize(PROMPTS[3]), max_tokens=24, strategy="ngram")
    got[id(late)] = []
    batch.add(late)
    for event in batch.step():
        got[id(event.gen)] += [r.token for r in event.tokens]
    assert late in batch.running, "the freed sequence goes to the next request at the next step"
    while not batch.idle:
        for event in batch.step():
            got[id(event.gen)] += [r.token for r in event.tokens]
    for gen, want in ((gens[0], alone[0]), (gens[2], alone[2]), (late, alone[3])):
        assert got[id(gen)] == want.tokens


class _Failing:
    """A drafter that breaks at its third draft (a bug, a grammar gone wrong)."""

    name, free, takes_stop_rule = "failing", True, False

    def __init__(self):
        self.calls = 0

    def use_sequence(self, seq_id):
        pass

    def begin(self, context):
        pass

    def draft(self, context, n, params, rng, stop=None):
        self.calls += 1
        if self.calls == 3:
            raise LocalspecError("the drafter broke", hint="none")
        return Draft()

    lookup = draft

    def finish(self, context):
        pass


def test_a_request_that_fails_fails_alone():
    model = Model(constants.EMBEDDED_TARGET, n_ctx=128, n_threads=2, n_seq=2)
    try:
        engine = Engine(model)
        prompt = model.tokenize("def fib(n):")
        alone = [
            r.token
            for r in engine.stream(prompt, max_tokens=16, params=SamplingParams(), settings=_s(), stats=_st())
        ]
        ok = engine.start(prompt, max_tokens=16, params=SamplingParams(), settings=_s(), stats=_st())
        bad = engine.start(
            prompt, drafter=_Failing(), max_tokens=16, params=SamplingParams(), settings=_s(), stats=_st()
        )
        tokens: list[int] = []
        while ok.finish is None:
            out = engine.step([g for g in (ok, bad) if g.finish is None])
            tokens += [r.token for r in out[0]]
        assert isinstance(bad.error, LocalspecError) and bad.finish == "error"
        assert tokens == alone
        engine.end(ok)
        engine.end(bad)
    finally:
        model.close()


def _s():
    return DraftSettings(strategy="ngram")


def _st():
    from localspec.decoding.stats import GenerationStats

    return GenerationStats()


def test_a_long_prompt_goes_in_by_chunks_beside_running_requests():
    """While two requests generate, a prompt longer than a chunk joins in several steps, each of which still
    gives the running requests their tokens."""
    model = Model(constants.EMBEDDED_TARGET, n_ctx=1024, n_threads=2, n_seq=3, n_batch=512)
    try:
        engine = Engine(model)
        short = model.tokenize("def fib(n):")
        long = model.tokenize("x = 1\n" * 100)
        assert len(long) > 256
        running = [
            engine.start(short, max_tokens=40, params=SamplingParams(), settings=_s(), stats=_st())
            for _ in range(2)
        ]
        for _ in range(2):
            engine.step(running)
        newcomer = engine.start(long, max_tokens=4, params=SamplingParams(), settings=_s(), stats=_st())
        steps = 0
        while not newcomer.begun:
            outs = engine.step([*running, newcomer])
            steps += 1
            assert all(len(o) >= 1 for o in outs[:2]), "the running requests got no token in a prefill step"
        assert steps >= 2
        for gen in (*running, newcomer):
            engine.end(gen)
    finally:
        model.close()


def test_the_mtp_layers_are_refused_for_several_sequences():
    with pytest.raises(SettingsError, match="one sequence at a time"):
        check_sequences(2, mtp=True, what="x.gguf")
    with pytest.raises(SettingsError, match="out of range"):
        check_sequences(0, mtp=False)


def test_sequences_that_do_not_fit_the_memory_are_refused_with_the_most_that_do(monkeypatch):
    with localspec.load() as pipe:
        info = pipe.info
    monkeypatch.setattr(pipeline_module, "available_bytes", lambda: 10**9)
    with pytest.raises(SettingsError) as err:
        pipeline_module.check_parallel_fits(info, n_ctx=100_000, parallel=200)
    assert "KV cache" in str(err.value) and "parallel" in (err.value.hint or "")
    n, why = pipeline_module.choose_parallel(info, n_ctx=100_000, mtp=False)
    assert n < pipeline_module.DEFAULT_PARALLEL and "memory" in why
    assert pipeline_module.choose_parallel(info, n_ctx=256, mtp=True) == (
        1,
        "the MTP layers draft for one request at a time",
    )


def test_drafts_are_cut_where_a_shared_pass_stops_being_free():
    sure, unsure = [0.99, 0.98, 0.97, 0.96], [0.5, 0.25, 0.12, 0.06]
    flat = batch_lengths([sure, unsure], [4, 4], base=2, verify=lambda b: 1.0)
    assert flat == [4, 4], "a pass that costs the same at any width keeps every draft"
    linear = batch_lengths([sure, unsure], [4, 4], base=2, verify=lambda b: 1.0 + 0.45 * b)
    assert linear[0] == 4 and linear[1] < 2, linear
    steep = batch_lengths([unsure] * 4, [4] * 4, base=4, verify=lambda b: float(b))
    assert steep == [0, 0, 0, 0], "where each row costs a whole pass, unsure drafts all go"


def test_pass_costs_give_a_curve_once_two_widths_ran():
    costs = PassCosts()
    costs.add(3, 0.3)
    assert costs.curve() is None
    costs.add(5, 0.5)
    curve = costs.curve()
    assert curve is not None and math.isclose(curve(3), 0.3) and math.isclose(curve(4), 0.4, rel_tol=1e-6)


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_a_hybrid_target_is_lossless_with_four_sequences(tmp_path, arch):
    """Four requests on a recurrent target (snapshots for qwen35, checkpoints for qwen3next), drafts mostly
    rejected at different positions (another seed's draft): each is the target's own text alone."""
    target, other = write_model(tmp_path, arch, 1), write_model(tmp_path, arch, 2)
    prompts = [PROMPT[i:] + PROMPT[:i] for i in (0, 3, 5, 8)]
    kw = {"max_tokens": MAX_TOKENS, "strategy": "model", "adaptive": False, "p_min": 0.0}
    with localspec.load(
        target, other, n_ctx=256, n_threads=2, n_max=4, suffix_store=False, parallel=4
    ) as pipe:
        alone = [[r.token for r in pipe.stream_tokens(p, **kw)] for p in prompts]
        batch = pipe.batch(fit=False)
        gens = [pipe.start_tokens(p, **kw) for p in prompts]
        got: dict[int, list[int]] = {id(g): [] for g in gens}
        for gen in gens:
            batch.add(gen)
        while not batch.idle:
            for event in batch.step():
                assert event.error is None
                got[id(event.gen)] += [r.token for r in event.tokens]
        assert [got[id(g)] for g in gens] == alone
        assert sum(g.stats.drafted for g in gens) > 0 and pipe.target.rollback.resets == 0


def test_the_one_line_api_takes_a_list_of_prompts():
    texts = localspec.generate(PROMPTS[:2], max_tokens=8, suffix_store=False)
    assert isinstance(texts, list) and len(texts) == 2
    assert [t.tokens for t in texts] == [
        localspec.generate(p, max_tokens=8, suffix_store=False).tokens for p in PROMPTS[:2]
    ]
    with pytest.raises(SettingsError, match="list of prompts"):
        with localspec.load() as pipe:
            pipe.generate_many("one string")


def test_sampling_keeps_the_targets_distribution_in_a_mixed_batch(pipe3):
    """The second sampled token of one request (temperature 1, its draft model drafting) beside two greedy
    requests of other prompts, against the same request sampled by the target alone: the same distribution."""
    from _chi2 import chi2_pvalue

    prompt = pipe3.tokenize("def fib(n):")
    others = [pipe3.tokenize(p) for p in PROMPTS[1:3]]
    alone, mixed = [], []
    for seed in range(200):
        base = list(pipe3.stream_tokens(prompt, max_tokens=2, temperature=1.0, seed=seed, baseline=True))
        alone.append(base[-1].token)
        batch = pipe3.batch()
        mine = pipe3.start_tokens(
            prompt, max_tokens=2, temperature=1.0, seed=seed, strategy="model", adaptive=False
        )
        for gen in (mine, *(pipe3.start_tokens(o, max_tokens=3, strategy="ngram") for o in others)):
            batch.add(gen)
        last = None
        while not batch.idle:
            for event in batch.step():
                if event.gen is mine and event.tokens:
                    last = event.tokens[-1].token
        mixed.append(last)
    assert chi2_pvalue(alone, mixed) > 0.001


def test_a_json_schema_request_stays_valid_beside_free_text(pipe3):
    import json

    from localspec import Grammar

    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}, "required": ["n"]}
    batch = pipe3.batch()
    constrained = pipe3.start_tokens(pipe3.tokenize("{"), max_tokens=40, grammar=Grammar.json_schema(schema))
    free = [pipe3.start_tokens(pipe3.tokenize(p), max_tokens=20, strategy="ngram") for p in PROMPTS[:2]]
    texts: dict[int, str] = {}
    for gen in (constrained, *free):
        batch.add(gen)
    while not batch.idle:
        for event in batch.step():
            assert event.error is None
            texts[id(event.gen)] = texts.get(id(event.gen), "") + "".join(r.text for r in event.tokens)
    assert constrained.finish == "stop"
    assert json.loads(texts[id(constrained)])["n"] <= 9


def test_the_published_clients_table_is_its_result_file():
    """docs/batching.md prints the table `localspec bench --clients` rendered from its committed result."""
    import json
    from pathlib import Path

    from localspec.bench.clients_report import markdown, read_result

    root = Path(__file__).resolve().parent.parent
    result = root / "docs" / "results" / "clients.json"
    table = markdown(read_result(json.loads(result.read_text(encoding="utf-8")), str(result)))
    assert table in (root / "docs" / "batching.md").read_text(encoding="utf-8")
