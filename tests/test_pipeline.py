"""The Pipeline as callers use it: small contexts, long drafts, sharing across threads and interleaved
streams, settings from presets, per-token results, bad values. All on the embedded pair (fast, offline)."""

from __future__ import annotations

import copy
import json
import math
import pickle
import threading

import numpy as np
import pytest

import localspec
from localspec import constants
from localspec.decoding.draft import Draft
from localspec.decoding.engine import MAX_CONTROLLERS, Engine
from localspec.decoding.stats import GenerationStats
from localspec.errors import ContextOverflowError, SettingsError
from localspec.llama.loading import default_gpu_layers, placement
from localspec.llama.runtime import Model
from localspec.llama.sampling import SamplingParams
from localspec.settings import MTP_STRATEGIES, STRATEGIES, DraftSettings

#: What the embedded pair runs: every strategy but the MTP ones (its files have no MTP layers: test_mtp.py)
PAIR_RUNS = tuple(s for s in STRATEGIES if s not in MTP_STRATEGIES)

WORDS = (
    "the quick brown fox jumps over the lazy dog while seven wizards quietly pack boxes of liquor jugs "
    "and the farmer counts sheep under a pale moon near the old mill by the river where children play "
    "with wooden boats every summer evening after school is done"
).split()
PROMPT_60_WORDS = " ".join(WORDS[:60])
REPEAT = "x = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]\n" * 4


@pytest.fixture(scope="module")
def small_pipe():
    """n_ctx 64: llama.cpp gives a 256-token context but a 64-token batch."""
    pipe = localspec.load(n_ctx=64, n_threads=2, n_max=4)
    yield pipe
    pipe.close()


# Batch and context: items 1 and 2 of issue 9 ------------------------------------------------------
def test_a_prompt_longer_than_the_batch_is_prefilled_in_chunks(small_pipe, embedded_pipe):
    assert small_pipe.max_draft == 63  # the batch llama.cpp really has (64), not the 512 asked for
    tokens = small_pipe.tokenize(PROMPT_60_WORDS)
    assert len(tokens) > 64  # longer than one batch: decoded whole, it aborted the process
    ref = embedded_pipe.generate(PROMPT_60_WORDS, max_tokens=4, baseline=True)
    for strategy in PAIR_RUNS:
        out = small_pipe.generate(PROMPT_60_WORDS, max_tokens=4, strategy=strategy)
        assert out.tokens == ref.tokens, strategy


def test_a_prompt_longer_than_the_context_is_refused_with_a_true_hint(small_pipe):
    long_prompt = " ".join(WORDS * 3)
    assert len(small_pipe.tokenize(long_prompt)) > small_pipe.n_ctx
    with pytest.raises(ContextOverflowError) as exc:
        small_pipe.generate(long_prompt, max_tokens=4)
    assert "prompt alone" in exc.value.hint and "max_tokens to" not in exc.value.hint
    n = len(small_pipe.tokenize(PROMPT_60_WORDS))
    with pytest.raises(ContextOverflowError) as exc:  # here lowering max_tokens does help
        small_pipe.generate(PROMPT_60_WORDS, max_tokens=small_pipe.n_ctx)
    assert f"max_tokens to {small_pipe.n_ctx - n} or less" in exc.value.hint
    assert "larger n_ctx" in exc.value.hint


def test_an_n_ctx_past_the_trained_context_is_lowered_and_the_refusal_says_so():
    pipe = localspec.load(n_ctx=200_000, n_threads=1)
    try:
        trained = pipe.info.n_ctx_train
        assert pipe.n_ctx == trained and pipe.n_ctx_asked == 200_000
        with pytest.raises(ContextOverflowError) as exc:
            pipe.generate("def f():", max_tokens=trained)
        assert "n_ctx 200000 lowered to the model's trained context" in exc.value.message
        assert "larger n_ctx" not in exc.value.hint and f"trained on {trained} tokens" in exc.value.hint
    finally:
        pipe.close()


def test_a_draft_longer_than_one_pass_is_refused_and_the_longest_one_is_verified(small_pipe, embedded_pipe):
    with pytest.raises(SettingsError, match="n_max 64"):  # 65 rows in a 64-token batch: out of bounds
        small_pipe.generate(REPEAT, max_tokens=8, strategy="ngram", n_max=64)
    with pytest.raises(SettingsError, match="n_max 64"):
        localspec.load(n_ctx=64, n_threads=2, n_max=64, draft="ngram")
    ref = embedded_pipe.generate(REPEAT, max_tokens=48, baseline=True)
    out = small_pipe.generate(REPEAT, max_tokens=48, strategy="ngram", n_max=small_pipe.max_draft)
    assert out.tokens == ref.tokens
    assert len(out.stats.drafted_by_position) > 16, "no long draft was verified: the test proves nothing"


def test_load_bounds_every_size(tmp_path):
    for kw, what in [
        ({"n_ctx": 8}, "n_ctx 8"),
        ({"n_ctx": 10**12}, "n_ctx 1000000000000"),
        ({"n_threads": 100000}, "threads 100000"),
        ({"n_threads": 0}, "threads 0"),
        ({"n_gpu_layers": -2}, "GPU layers -2"),
        ({"draft_n_threads": 100000}, "threads 100000"),
    ]:
        with pytest.raises(SettingsError, match=what) as exc:
            localspec.load(**kw)
        assert exc.value.hint
    pipe = localspec.load(n_ctx=100000, n_threads=2, draft="none")  # lowered to the trained context
    try:
        assert pipe.n_ctx == pipe.info.n_ctx_train == 2048
    finally:
        pipe.close()


def test_draft_auto_is_automatic_pairing_in_the_api_as_on_every_command_line():
    """`--draft auto` (run, bench, serve, ui) and ``load(draft="auto")`` are the default, not a file."""
    with localspec.load(n_threads=2, draft="auto") as auto, localspec.load(n_threads=2) as default:
        assert auto.info.draft_path == default.info.draft_path is not None
        assert auto.settings == default.settings


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_p": 2.0}, "top_p"),
        ({"min_p": 1.0}, "min_p"),
        ({"min_p": math.nan}, "min_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n_max": 0}, "n_max"),
        ({"p_min": math.nan}, "p_min"),
        ({"strategy": "magic"}, "strategy"),
        ({"stop": 5}, "stop"),
        ({"stop": ["ok", 5]}, "stop"),
    ],
)
def test_bad_generation_values_are_refused_with_a_hint(embedded_pipe, kw, name):
    with pytest.raises(SettingsError, match=name) as exc:
        embedded_pipe.generate("def f():", **{"max_tokens": 4, **kw})
    assert exc.value.hint
    if name == "stop":  # raised when the stream is made, as every other value is, not at its first token
        with pytest.raises(SettingsError, match=name):
            embedded_pipe.stream("def f():", **{"max_tokens": 4, **kw})


def test_one_stop_string_is_one_stop_string_not_its_characters(embedded_pipe):
    """OpenAI's API takes ``stop`` as a string too; iterated, "ret" would stop at the first 'e'."""
    free = str(embedded_pipe.generate("def fib(n):\n    return", max_tokens=40, strategy="none"))
    # a 3-character stop string that first occurs at k, one of whose characters occurs before k
    k = next(
        k
        for k in range(3, len(free) - 3)
        if free.index(free[k : k + 3]) == k and set(free[k : k + 3]) & set(free[:k])
    )
    cut = embedded_pipe.generate(
        "def fib(n):\n    return", max_tokens=40, strategy="none", stop=free[k : k + 3]
    )
    assert str(cut) == free[:k], (free, k)
    assert cut.stats.finish_reason == "stop"


@pytest.mark.parametrize(
    ("prompt", "said"),
    [
        (b"def f():", "must be text (a str), got bytes"),
        (["def f():"], "for token ids use stream_tokens()"),
        (None, "got NoneType"),
        ("def \udcff():", "not valid UTF-8 text: byte 0xff at character 4"),  # a non-UTF-8 argv byte
        ("\ud800", "lone surrogate U+D800"),
    ],
)
def test_a_prompt_that_is_not_utf8_text_is_refused_naming_it(embedded_pipe, prompt, said):
    with pytest.raises(SettingsError, match="the prompt") as exc:
        embedded_pipe.generate(prompt, max_tokens=4)
    assert said in str(exc.value) and exc.value.hint


@pytest.mark.parametrize(
    ("tokens", "said"),
    [
        (
            [5, 10**9],
            "token id 1000000000 at position 1 is outside tiny-target.gguf's vocabulary (0 to 2047)",
        ),
        ([-1], "token id -1 at position 0"),
        ([1, "x"], "must be a list of token ids"),
        ([], "tokens is empty"),
        ("def", "takes token ids, got text"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_named_not_a_full_context(embedded_pipe, tokens, said):
    """llama.cpp refuses such an id only with a decode status the engine would read as a full context."""
    with pytest.raises(SettingsError) as exc:
        embedded_pipe.stream_tokens(tokens, max_tokens=4)
    assert said in exc.value.message
    ids = embedded_pipe.tokenize("def f():")
    assert str(embedded_pipe.generate("def f():", max_tokens=8)) == "".join(
        r.text for r in embedded_pipe.stream_tokens(np.array(ids), max_tokens=8)
    ), "numpy ids are ids too"


# Sharing: item 3 of issue 9 ----------------------------------------------------------------------
JOBS = [
    ("def fib(n):", "model"),
    (REPEAT, "ngram"),
    ("import os\n\n\ndef read_lines(path):\n", "model+ngram"),
    ("class Stack:\n    def push(self, item):\n", "none"),
]


def _reference(pipe, prompt, strategy):
    return pipe.generate(prompt, max_tokens=40, strategy=strategy)


def test_one_pipeline_shared_by_four_threads_gives_every_thread_its_own_text(embedded_pipe):
    refs = [_reference(embedded_pipe, p, s) for p, s in JOBS]
    results: dict[int, list] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(JOBS))

    def work(i):
        prompt, strategy = JOBS[i]
        try:
            barrier.wait()
            results[i] = [_reference(embedded_pipe, prompt, strategy).tokens for _ in range(3)]
        except BaseException as exc:  # pragma: no cover - shown by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(JOBS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and not any(t.is_alive() for t in threads)
    for i, ref in enumerate(refs):
        assert results[i] == [ref.tokens] * 3, JOBS[i]


def test_interleaved_streams_in_one_thread_each_keep_their_own_context(embedded_pipe):
    # every round follows another stream's, so each re-syncs both caches: keep it short
    refs = [embedded_pipe.generate(p, max_tokens=16, strategy=s) for p, s in JOBS]
    streams = [embedded_pipe.stream(p, max_tokens=16, strategy=s) for p, s in JOBS]
    outs: list[list] = [[] for _ in JOBS]
    live = set(range(len(JOBS)))
    while live:  # one token from each in turn: every round follows another stream's round
        for i in sorted(live):
            r = next(streams[i], None)
            if r is None:
                live.discard(i)
            else:
                outs[i].append(r)
    for i, ref in enumerate(refs):
        assert [r.token for r in outs[i]] == ref.tokens, JOBS[i]
        assert "".join(r.text for r in outs[i]) == str(ref)
        # the drafter's state (n-gram tables) was its own: it proposed exactly what it proposes alone
        assert outs[i][-1].stats.drafted == ref.stats.drafted, JOBS[i]
        assert outs[i][-1].stats.accepted == ref.stats.accepted, JOBS[i]


def test_a_suspended_stream_blocks_no_other_thread_and_resumes_correctly(embedded_pipe):
    prompt, strategy = JOBS[2]
    ref = _reference(embedded_pipe, prompt, strategy)
    other_ref = _reference(embedded_pipe, *JOBS[1])
    stream = embedded_pipe.stream(prompt, max_tokens=40, strategy=strategy)
    head = [next(stream) for _ in range(5)]
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", _reference(embedded_pipe, *JOBS[1])))
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "a suspended stream held the pipeline"
    assert box["r"].tokens == other_ref.tokens
    rest = list(stream)
    assert [r.token for r in head + rest] == ref.tokens


def test_an_abandoned_stream_leaves_the_pipeline_usable(embedded_pipe):
    ref = _reference(embedded_pipe, *JOBS[0])
    stream = embedded_pipe.stream(JOBS[1][0], max_tokens=40, strategy="ngram")
    next(stream)
    del stream  # never closed explicitly: collected
    assert _reference(embedded_pipe, *JOBS[0]).tokens == ref.tokens


# Engine and drafter interface --------------------------------------------------------------------
class _Recorder:
    """A drafter that proposes a fixed token and records the calls the engine makes."""

    name = "recorder"
    free = True
    takes_stop_rule = False

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def begin(self, context):
        self.calls.append(("begin", len(context)))

    def draft(self, context, n, params, rng, stop=None):
        return Draft(tokens=[context[-1]] * n, source="recorder", sources=["history"] * n)

    def use_sequence(self, seq_id):
        pass

    def lookup(self, context, n, params, rng):
        return self.draft(context, n, params, rng)

    def finish(self, context):
        self.calls.append(("finish", len(context)))


@pytest.fixture(scope="module")
def bare_engine():
    model = Model(constants.EMBEDDED_TARGET, n_ctx=64, n_threads=2)  # a 64-token batch
    yield Engine(model)
    model.close()


def test_the_engine_calls_finish_after_every_generation(bare_engine):
    prompt = bare_engine.target.tokenize("def fib(n):")
    settings = DraftSettings(strategy="ngram", n_max=3)
    rec = _Recorder()
    out = list(
        bare_engine.stream(
            prompt,
            drafter=rec,
            max_tokens=6,
            params=SamplingParams(),
            settings=settings,
            stats=GenerationStats(),
        )
    )
    assert rec.calls == [("begin", len(prompt) - 1), ("finish", len(prompt) + 6)]
    assert {r.source for r in out if r.from_draft} <= {"history"}
    assert all(r.source is None for r in out if not r.from_draft)
    rec = _Recorder()
    stream = bare_engine.stream(
        prompt, drafter=rec, max_tokens=6, params=SamplingParams(), settings=settings, stats=GenerationStats()
    )
    next(stream)
    stream.close()  # cancelled: finish still runs
    assert rec.calls[-1][0] == "finish"


def test_adaptive_controllers_are_bounded(bare_engine):
    prompt = bare_engine.target.tokenize("def fib(n):")
    for i in range(MAX_CONTROLLERS + 4):
        settings = DraftSettings(strategy="ngram", n_max=3, p_min=i / 100, adaptive=True)
        list(
            bare_engine.stream(
                prompt,
                drafter=_Recorder(),
                max_tokens=2,
                params=SamplingParams(),
                settings=settings,
                stats=GenerationStats(),
            )
        )
    assert len(bare_engine._controllers) == MAX_CONTROLLERS


def test_per_call_limits_do_not_change_the_shared_draft_model(embedded_pipe):
    before = (embedded_pipe._model_drafter.n_min, embedded_pipe._model_drafter.p_min)
    embedded_pipe.generate("def fib(n):", max_tokens=8, strategy="model", p_min=0.0, n_min=2)
    assert (embedded_pipe._model_drafter.n_min, embedded_pipe._model_drafter.p_min) == before


# Results -----------------------------------------------------------------------------------------
def test_each_token_carries_the_counts_at_that_token_and_its_source(embedded_pipe):
    responses = list(embedded_pipe.stream(REPEAT, max_tokens=24, strategy="model+ngram"))
    assert [r.stats.generated_tokens for r in responses] == list(range(1, 25))
    assert responses[0].stats.drafted <= responses[-1].stats.drafted
    assert responses[0].stats is not responses[-1].stats
    final = responses[-1].stats
    assert final.finish_reason == "length" and responses[0].stats.finish_reason is None
    drafted = [r for r in responses if r.from_draft]
    assert drafted and all(r.source in ("model", "prompt") for r in drafted)
    assert all(r.source is None for r in responses if not r.from_draft)
    assert sum(final.drafted_by_source.values()) == final.drafted
    assert sum(final.accepted_by_source.values()) == final.accepted
    by_source = final.as_dict()["acceptance_by_source"]
    assert set(by_source) == set(final.drafted_by_source) and "prompt" in by_source


def test_results_copy_pickle_and_print(embedded_pipe, capsys):
    r = embedded_pipe.generate("def fib(n):", max_tokens=8, strategy="ngram")
    for other in (copy.copy(r), copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert other == r and type(other) is type(r)
        assert other.tokens == r.tokens and other.from_draft == r.from_draft and other.pieces == r.pieces
        assert other.stats.as_dict() == r.stats.as_dict()
    print(r)
    assert capsys.readouterr().out == str(r) + "\n"
    r.tool_calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert pickle.loads(pickle.dumps(r)).tool_calls == copy.deepcopy(r).tool_calls == r.tool_calls


def test_chat_with_tools_needs_a_template_that_calls_them(embedded_pipe):
    from test_tool_calls import WEATHER

    from localspec.pipeline.tool_schema import ToolCallError

    ask = [{"role": "user", "content": "Weather in Paris?"}]
    with pytest.raises(ToolCallError, match="no tool-call format") as err:
        embedded_pipe.chat(ask, tools=[WEATHER], max_tokens=4)
    assert err.value.param == "tools" and err.value.hint
    plain = embedded_pipe.chat(ask, max_tokens=6, temperature=0)
    shown_none = embedded_pipe.chat(ask, tools=[WEATHER], tool_choice="none", max_tokens=6, temperature=0)
    assert shown_none == plain and plain.tool_calls == shown_none.tool_calls == []


def _assembled(responses) -> tuple[str, list[tuple[str, str]]]:
    """A chat stream's content and calls (name, arguments), put together as a client does."""
    from test_tool_calls import _assembled as calls_of

    calls = calls_of([d for r in responses for d in r.tool_calls])
    return "".join(r.content for r in responses), [(n, a) for _, n, a in calls]


def test_chat_stream_reads_calls_out_as_they_are_written(embedded_pipe, monkeypatch):
    from test_tool_calls import TOOL_TEMPLATE, WEATHER

    from localspec.decoding.engine import TokenResponse

    monkeypatch.setattr(type(embedded_pipe), "chat_template", property(lambda self: TOOL_TEMPLATE))
    pieces = ["Checking.", "\n", "<tool", "_call>\n", '{"name": "get_weather", ', '"arguments": {"city": ']
    pieces += ['"Paris"}}\n', "</tool_call>"]

    def scripted(tokens, **kw):
        for i, piece in enumerate(pieces):
            yield TokenResponse(piece, i, False, GenerationStats(), "stop" if i == len(pieces) - 1 else None)

    monkeypatch.setattr(embedded_pipe, "stream_tokens", scripted)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    responses = list(embedded_pipe.chat_stream(ask, tools=[WEATHER]))
    assert isinstance(responses[0], localspec.ChatResponse) and [r.text for r in responses] == pieces
    # the name once `"arguments": ` is written, then the arguments as they come
    assert [bool(r.tool_calls) for r in responses] == [False] * 5 + [True, True, False]
    first = responses[5].tool_calls[0]
    assert first["id"].startswith("call_") and first["index"] == 0
    assert first["function"]["name"] == "get_weather"
    content, calls = _assembled(responses)
    whole = embedded_pipe.chat(ask, tools=[WEATHER])
    assert content == whole.content == "Checking." and "<tool" not in content and whole == "".join(pieces)
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in whole.tool_calls]
    assert json.loads(calls[0][1]) == {"city": "Paris"}
    plain = list(embedded_pipe.chat_stream(ask))  # no tools: the content is the text
    assert [r.content for r in plain] == pieces and not any(r.tool_calls for r in plain)


def test_a_required_call_streams_as_the_whole_reply_reads_it(embedded_pipe, monkeypatch):
    """The real model under the calls' grammar (tool_choice required): what the stream sends, put
    together, is what chat() reads out of the same greedy reply."""
    from test_tool_calls import TOOL_TEMPLATE, WEATHER

    monkeypatch.setattr(type(embedded_pipe), "chat_template", property(lambda self: TOOL_TEMPLATE))
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    kw = dict(tools=[WEATHER], tool_choice="required", max_tokens=80, temperature=0)
    responses = list(embedded_pipe.chat_stream(ask, **kw))
    whole = embedded_pipe.chat(ask, **kw)
    assert "".join(r.text for r in responses) == whole
    content, calls = _assembled(responses)
    assert calls and calls == [(c["function"]["name"], c["function"]["arguments"]) for c in whole.tool_calls]
    assert content == whole.content and calls[0][0] == "get_weather"


# Placement ---------------------------------------------------------------------------------------
def test_gpu_layers_default_to_all_only_when_llama_cpp_can_offload():
    assert default_gpu_layers(None, offload=True) == -1
    assert default_gpu_layers(None, offload=False) == 0
    assert default_gpu_layers(0, offload=True) == 0 and default_gpu_layers(12, offload=False) == 12
    assert placement(-1, 28, offload=True) == "GPU (all layers)"
    assert placement(28, 28, offload=True) == "GPU (all layers)"
    assert placement(10, 28, offload=True) == "GPU 10/28 layers, rest CPU"
    assert placement(0, 28, offload=True) == placement(-1, 28, offload=False) == "CPU"


def test_the_pipeline_says_where_each_model_runs(embedded_pipe, monkeypatch):
    from localspec.llama.loading import supports_gpu_offload

    offload = supports_gpu_offload()  # (llama.cpp's own answer is yes for any build with RPC: test_rpc.py)
    expected = "GPU (all layers)" if offload else "CPU"
    assert embedded_pipe.placement == {"target": expected, "draft": expected}
    r = embedded_pipe.generate("def fib(n):", max_tokens=4)
    assert r.stats.placement == embedded_pipe.placement
    assert f"runs on target {expected}, draft {expected}" in r.stats.summary_line()
    seen = []
    monkeypatch.setattr("localspec.pipeline.models.supports_gpu_offload", lambda: True)
    monkeypatch.setattr("localspec.pipeline.models.Model", lambda path, **kw: seen.append(kw) or _raise())
    with pytest.raises(_Stop):
        localspec.load(n_threads=2)
    with pytest.raises(_Stop):
        localspec.load(n_threads=2, n_gpu_layers=0)
    assert seen[0]["n_gpu_layers"] == -1 and seen[1]["n_gpu_layers"] == 0


class _Stop(Exception):
    pass


def _raise():
    raise _Stop


def test_rows_of_a_verify_pass_all_come_from_one_decode(bare_engine):
    model = bare_engine.target
    model.reset()
    tokens = model.tokenize(PROMPT_60_WORDS * 3)[: model.n_ctx - 8]
    assert len(tokens) > model.n_batch
    rows = np.array(model.decode_logits(tokens, outputs=3))
    model.reset()
    model.decode(tokens[:-3])
    again = np.array(model.decode_logits(tokens[-3:], outputs=3))
    model.reset()
    assert rows.shape == again.shape == (3, model.n_vocab)
    assert (rows.argmax(axis=1) == again.argmax(axis=1)).all()
    with pytest.raises(SettingsError, match="batch"):
        model.decode_logits(tokens, outputs=model.n_batch + 1)


# Presets run what they say: issue 13 -------------------------------------------------------------
def _user_preset(config, name, strategy):
    folder = config / "presets"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(
        f'[[preset]]\nname = "{name}"\n'
        f'target = {{ path = "{constants.EMBEDDED_TARGET}" }}\n'
        f'draft_model = {{ path = "{constants.EMBEDDED_DRAFT}" }}\n'
        f'n_ctx = 512\n[preset.draft]\nstrategy = "{strategy}"\nn_max = 3\np_min = 0.5\n'
    )


@pytest.mark.parametrize("strategy", PAIR_RUNS)
def test_a_preset_runs_its_own_strategy(tmp_path, monkeypatch, strategy):
    monkeypatch.setenv("LOCALSPEC_CONFIG", str(tmp_path))
    name = f"user-{strategy.replace('+', '-')}"
    _user_preset(tmp_path, name, strategy)
    settings = DraftSettings(strategy=strategy, n_max=3, p_min=0.5)
    uses_model = settings.may_use_model  # "auto" keeps a named draft model: it may route to it

    def ran(stats) -> bool:  # "auto" runs what it routed to, and says so
        if strategy == "auto":
            return stats.route is not None and stats.route.strategy == stats.strategy
        return stats.strategy.name == strategy

    pipe = localspec.load(preset=name, n_threads=2)
    try:
        assert pipe.settings == settings
        assert (pipe.info.draft_path is not None) == uses_model  # the draft model loads only when used
        assert (pipe.memory.draft_weights_bytes > 0) == uses_model
        r = pipe.generate(REPEAT, max_tokens=12)
        assert ran(r.stats)
        assert (r.stats.drafted > 0) == (strategy != "none")
    finally:
        pipe.close()
    r = localspec.generate(REPEAT, preset=name, max_tokens=6, n_threads=2)  # the one-line entry point
    assert ran(r.stats)
    # explicit arguments override the preset
    override = "none" if strategy != "none" else "ngram"
    with localspec.load(preset=name, n_threads=2, strategy=override) as pipe:
        assert pipe.generate(REPEAT, max_tokens=4).stats.strategy.name == override
    with localspec.load(preset=name, n_threads=2, draft="ngram", n_max=5) as pipe:
        assert pipe.settings.strategy.name == "ngram" and pipe.settings.n_max == 5


def test_a_swapped_pair_says_so_in_the_note_run_prints():
    pipe = localspec.load(
        target=constants.EMBEDDED_DRAFT, draft=constants.EMBEDDED_TARGET, n_threads=1, n_ctx=256
    )
    try:
        assert "warning: the draft" in pipe.info.note and "swapped" in pipe.info.note
    finally:
        pipe.close()
    pipe = localspec.load(n_threads=1, n_ctx=256)
    try:
        assert "warning" not in pipe.info.note
    finally:
        pipe.close()


def test_chat_checks_its_messages_as_the_server_does(embedded_pipe):
    """The API passed messages straight to the template: Jinja's errors, or (Qwen's template) a turn of an
    unknown role silently left out of the prompt."""
    from localspec.errors import MessageError

    for bad in ([{"role": "bogus", "content": "hi"}], [{"role": "user", "content": 5}], "hi", []):
        with pytest.raises(MessageError):
            embedded_pipe.chat(bad, max_tokens=4)
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]}]
    plain = [{"role": "user", "content": "Say hi"}]
    assert str(embedded_pipe.chat(parts, max_tokens=6)) == str(embedded_pipe.chat(plain, max_tokens=6))


def test_the_one_line_api_loads_again_when_its_pipeline_was_closed():
    from localspec.pipeline import loading

    first = localspec.generate("def f():", max_tokens=4, n_ctx=512)
    (pipe,) = loading._CACHE.values()
    pipe.close()  # e.g. a library that closes what it was handed
    assert pipe.closed
    again = localspec.generate("def f():", max_tokens=4, n_ctx=512)
    assert str(again) == str(first)
    for p in loading._CACHE.values():
        p.close()
    loading._CACHE.clear()


@pytest.mark.parametrize("name", ["target", "draft", "preset"])
def test_an_empty_model_or_preset_name_is_refused_not_read_as_the_current_folder(name):
    with pytest.raises(SettingsError, match=f"{name} is an empty string"):
        localspec.load(**{name: ""})


def test_auto_pairs_a_draft_like_the_model_strategies_do(tmp_path):
    """`--strategy auto` with a target alone never loaded a draft, so 'the draft model where it pays'
    could not happen. A target with a fitting draft next to it:"""
    import shutil

    target = shutil.copy(constants.EMBEDDED_TARGET, tmp_path / "t.gguf")
    shutil.copy(constants.EMBEDDED_DRAFT, tmp_path / "d.gguf")
    with localspec.load(target=target, strategy="auto", n_threads=1, suffix_store=False) as pipe:
        assert pipe.info.draft_path == tmp_path / "d.gguf", pipe.info.note
        assert "automatic pairing picked d.gguf" in pipe.info.note
