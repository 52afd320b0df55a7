"""``localspec serve`` end to end: the real server (uvicorn in a thread) over the embedded pair, driven by
the official ``openai`` client (and plain httpx where a client would hide what is tested)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from test_tool_calls import TOOL_TEMPLATE, WEATHER, _assembled

import localspec
from localspec.serve.app import start_background
from localspec.serve.exposure import ExposureError
from localspec.serve.options import ServeOptions

N_CTX = 1024
PROMPTS = [
    "def quicksort(xs: list[int]) -> list[int]:\n",
    "import json\nfrom pathlib import Path\n\n\ndef load_settings(path: Path) -> dict:\n",
    "class Stack:\n    def push(self, item) -> None:\n",
    "Once upon a time",
    "The capital of France is",
    "for i in range(10):\n",
    "# A small HTTP client\nimport urllib.request\n",
    "def fib(n):\n",
]


def _load():
    return localspec.load(n_threads=2, n_ctx=N_CTX)


class SlowPipe:
    """The real pipeline with each token held back ``delay`` seconds, so a test can act mid-generation;
    ``produced`` counts the tokens the engine really generated for the last request."""

    def __init__(self, pipe, delay: float) -> None:
        self._pipe, self.delay, self.produced = pipe, delay, 0

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def stream_tokens(self, tokens, **kw):
        inner = self._pipe.stream_tokens(tokens, **kw)
        self.produced = 0

        def gen():
            try:
                for r in inner:
                    self.produced += 1
                    time.sleep(self.delay)
                    yield r
            finally:
                inner.close()

        return gen()


class LearningPipe:
    """The real pipeline whose streams, once closed, hold the worker until ``release`` is set (or raise,
    with ``fail``), as feeding a large suffix cache does after the last token (a merge, a save)."""

    def __init__(self, pipe, *, fail: bool = False) -> None:
        self._pipe, self.fail = pipe, fail
        self.closing, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def batch(self, **kw):
        batch = self._pipe.batch(**kw)
        learn = batch.on_end

        def on_end(gen):
            if learn is not None:
                learn(gen)
            self.closing.set()
            if self.fail:
                raise RuntimeError("the store's disk went away")
            self.release.wait(30)

        batch.on_end = on_end
        return batch


@pytest.fixture(scope="module")
def pipe():
    p = _load()
    yield p
    p.close()


@pytest.fixture(scope="module")
def server(pipe):
    srv = start_background(pipe, ServeOptions(port=0, aliases=("tiny-embedded",)))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def _complete(client, prompt, **kw):
    kw.setdefault("max_tokens", 40)
    kw.setdefault("temperature", 0)
    return client.completions.create(model="tiny-target", prompt=prompt, **kw)


# ------------------------------------------------------------------------------------------ the API
def test_models_lists_the_model_and_the_preset(client):
    listed = client.models.list().data
    assert [m.id for m in listed] == ["tiny-target", "tiny-embedded"]
    for m in listed:  # each model as its own endpoint describes it
        assert client.models.retrieve(m.id).model_dump() == m.model_dump() and m.created > 0


def test_completion_equals_the_pipeline_and_carries_usage_and_stats(client, pipe):
    r = _complete(client, PROMPTS[0], max_tokens=32)
    direct = pipe.generate(PROMPTS[0], max_tokens=32, temperature=0)
    assert r.choices[0].text == str(direct)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(pipe.tokenize(PROMPTS[0]))
    assert r.usage.completion_tokens == 32
    assert r.usage.total_tokens == r.usage.prompt_tokens + 32
    stats = r.model_extra["localspec"]
    assert stats["strategy"] == "model" and stats["draft"] == "tiny-draft.gguf"
    assert 0 < stats["accepted"] <= stats["drafted"]
    assert stats["acceptance"] == pytest.approx(stats["accepted"] / stats["drafted"], abs=1e-3)
    assert stats["mean_accepted_length"] > 0 and stats["tokens_per_second"] > 0
    assert stats["draft_memory_overhead_bytes"] == pipe.memory.draft_overhead_bytes > 0


def test_streaming_completion_equals_non_streaming(client):
    whole = _complete(client, PROMPTS[1]).choices[0].text
    chunks = list(_complete(client, PROMPTS[1], stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0].model_extra["localspec"]["drafted"] > 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert chunks[-1].model_extra["localspec"] == finals[0].model_extra["localspec"]  # the last chunk too


def test_chat_uses_the_models_template_streaming_and_not(client, pipe):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a function."}]
    r = client.chat.completions.create(model="tiny-embedded", messages=messages, max_tokens=30, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    direct = pipe.chat(messages, max_tokens=30, temperature=0)
    assert r.choices[0].message.content == str(direct)
    assert r.usage.prompt_tokens == len(pipe.format_chat(messages)[0])
    assert r.model_extra["localspec"]["strategy"] == "model"

    stream = client.chat.completions.create(
        model="tiny-target", messages=messages, max_tokens=30, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == str(direct)
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    assert "localspec" in chunks[-1].model_extra


def test_stop_strings_cut_the_text_streaming_and_not(client):
    ref = _complete(client, PROMPTS[3], max_tokens=60).choices[0].text
    stop = ref[20:26]
    assert stop.strip() and ref.find(stop) > 0
    r = _complete(client, PROMPTS[3], max_tokens=60, stop=[stop, "\u2603never"])
    assert r.choices[0].text == ref[: ref.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].text for c in _complete(client, PROMPTS[3], max_tokens=60, stop=stop, stream=True)
    )
    assert streamed == ref[: ref.find(stop)]


def test_missing_or_huge_max_tokens_is_clamped_to_the_context(client):
    r = _complete(client, PROMPTS[4], max_tokens=10**9)
    if r.choices[0].finish_reason == "length":  # ran until the context was full
        assert r.usage.total_tokens == N_CTX
    assert r.usage.total_tokens <= N_CTX
    r2 = client.completions.create(model="tiny-target", prompt=PROMPTS[4], temperature=0)  # no max_tokens
    assert r2.choices[0].text == r.choices[0].text


# ------------------------------------------------------------------------------------------ errors
def test_a_prompt_that_alone_overflows_the_context_is_refused(client):
    with pytest.raises(openai.BadRequestError) as err:
        _complete(client, "word " * (N_CTX + 10))
    assert err.value.code == "context_length_exceeded"
    assert "1024" in err.value.message and "larger --n-ctx" in err.value.message  # 1024 < 2048 trained


def test_a_context_at_the_trained_limit_says_so_not_to_raise_n_ctx():
    """--n-ctx 8192 on a model trained on 2048 is lowered; a larger --n-ctx would not help, and the refusal
    and the start-up lines say why."""
    with localspec.load(n_threads=2, n_ctx=8192) as pipe:
        assert pipe.n_ctx == 2048 and pipe.n_ctx_is_trained
        srv = start_background(pipe, ServeOptions(port=0))
        try:
            client = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=60)
            with pytest.raises(openai.BadRequestError) as err:
                _complete(client, "word " * 2100)
        finally:
            srv.stop()
    said = err.value.message
    assert err.value.code == "context_length_exceeded" and "--n-ctx" not in said, said
    assert "holds 2048 (n_ctx 8192 lowered to the model's trained context)" in said, said
    assert "the model was trained on 2048 tokens, the most it is loaded with" in said, said


@pytest.mark.parametrize(
    ("signals", "gap"), [(["SIGTERM"], 0), (["SIGINT", "SIGINT"], 0.05), (["SIGINT", "SIGINT"], 0.3)]
)
def test_serve_stops_cleanly_on_sigterm_and_on_ctrl_c_pressed_twice(tmp_path, signals, gap):
    """A supervisor's SIGTERM and an impatient second Ctrl-C: exit status 0, the 'stopped' line, no
    traceback (uvicorn raised each signal again after its shutdown; a second Ctrl-C forced an exit that
    printed its lifespan's traceback). The start-up lines say the context was lowered."""
    env = {**os.environ, "LOCALSPEC_HOME": str(tmp_path / "home"), "LOCALSPEC_CONFIG": str(tmp_path / "cfg")}
    cmd = [sys.executable, "-m", "localspec", "serve", "--port", "0", "--n-ctx", "8192"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    start: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            start.append(line)
            if "Ctrl+C to stop" in line:
                break
        assert "context 2048 tokens (n_ctx 8192 lowered to the model's trained context)" in "".join(start)
        time.sleep(0.3)
        for name in signals:
            proc.send_signal(getattr(signal, name))
            time.sleep(gap)
        rest = proc.stderr.read()
        assert proc.wait(30) == 0, rest
    finally:
        proc.kill()
    assert rest.strip().endswith("localspec serve stopped.") and "Traceback" not in rest, rest


def test_unknown_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-4o", prompt="hi", max_tokens=4)
    assert err.value.code == "model_not_found" and "tiny-target" in err.value.message


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"n": 2}, "n"),
        ({"temperature": 3.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -1}, "seed"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logprobs": 2}, "logprobs"),
        ({"stop": [f"s{i}" for i in range(20)]}, "stop"),
    ],
)
def test_bad_values_are_400_naming_the_parameter(client, kw, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny-target", prompt="hi", **{"max_tokens": 4, **kw})
    assert err.value.param == param
    assert param in err.value.message


def test_chat_refuses_images_unknown_roles_and_tools_its_template_cannot_call(client):
    bad = [
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"messages": [{"role": "wizard", "content": "hi"}]},
        {"messages": []},
    ]
    for kw in bad:
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="tiny-target", max_tokens=4, **kw)
    # the embedded model's template renders no tools: refused, never answered as if it could call them
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny-target", max_tokens=4, messages=[{"role": "user", "content": "hi"}], tools=[WEATHER]
        )
    assert err.value.param == "tools" and "<tool_call>" in err.value.message
    # tool_choice "none" needs no tool format: the model is not told of the tools
    r = client.chat.completions.create(
        model="tiny-target",
        max_tokens=4,
        messages=[{"role": "user", "content": "hi"}],
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")
    empty = client.chat.completions.create(  # what clients without tools send: no tools
        model="tiny-target",
        max_tokens=4,
        messages=[{"role": "user", "content": "hi"}],
        tools=[],
        temperature=0,
    )
    assert empty.choices[0].message.content == r.choices[0].message.content


# ------------------------------------------------------------------------------------------ tool calls


class ScriptedPipe:
    """The real pipeline (its template, tokenizer and KV cache) whose replies are scripted pieces of text,
    with a chat template that teaches the <tool_call> format; ``calls`` keeps each request's prompt."""

    chat_template = TOOL_TEMPLATE

    def __init__(self, pipe) -> None:
        self._pipe, self.script, self.prompts, self.kwargs = pipe, [], [], []

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def format_chat(self, messages, **kw):
        self.formatted = (messages, kw)
        return self._pipe.format_chat(messages, **kw)

    def start_tokens(self, tokens, **kw):
        from localspec.decoding.stats import GenerationStats

        self.prompts.append(list(tokens))
        self.kwargs.append(kw)
        return _ScriptedGeneration(list(self.script), GenerationStats())

    def batch(self, **kw):
        return _ScriptedBatch()


class _ScriptedGeneration:
    def __init__(self, pieces, stats):
        self.pieces, self.stats, self.finish = pieces, stats, None


class _ScriptedBatch:
    """The worker's batch, its tokens scripted: each step hands every generation its next piece."""

    def __init__(self):
        self.running = []

    def add(self, gen):
        self.running.append(gen)

    def cancel(self, gen):
        if gen in self.running:
            self.running.remove(gen)

    def step(self, deliver):
        from localspec.decoding.batch import StepEvent
        from localspec.decoding.engine import TokenResponse

        for gen in list(self.running):
            piece = gen.pieces.pop(0)
            gen.finish = None if gen.pieces else "stop"
            token = TokenResponse(piece, 0, False, gen.stats, gen.finish)
            deliver(StepEvent(gen, [token], gen.finish is not None))
            if gen.finish:
                self.running.remove(gen)


@pytest.fixture(scope="module")
def tool_server(pipe):
    scripted = ScriptedPipe(pipe)
    srv = start_background(scripted, ServeOptions(port=0))
    yield scripted, openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)
    srv.stop()


CALL_PIECES = [
    "<tool",
    "_call>\n",
    '{"name": "get_weather", ',
    '"arguments": {"city": ',
    '"Paris"}}\n',
    "</tool_call>",
]


def _streamed_calls(chunks) -> list[tuple[str, str]]:
    """(name, arguments) of the calls a stream sent, put together by index as OpenAI's clients do."""
    calls: dict[int, list] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            call = calls.setdefault(d.index, ["", ""])
            call[0] += d.function.name or ""
            call[1] += d.function.arguments or ""
    return [tuple(v) for _, v in sorted(calls.items())]


def _chat(client, stream=False, **kw):
    kw.setdefault("messages", [{"role": "user", "content": "Weather in Paris?"}])
    return client.chat.completions.create(model="tiny-target", tools=[WEATHER], stream=stream, **kw)


def test_a_tool_call_in_the_reply_is_returned_as_a_call_streaming_and_not(tool_server):
    scripted, client = tool_server
    scripted.script = CALL_PIECES
    r = _chat(client)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"} and call.id.startswith("call_")
    chunks = list(_chat(client, stream=True))
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # no tag leaks as text
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    # the name as soon as the call's start is written, then the arguments as they come
    assert deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_") and len(deltas) > 1
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
    assert _streamed_calls(chunks) == [("get_weather", call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # text before two calls; parallel_tool_calls=False keeps the first
    scripted.script = [
        "Checking.",
        "\n",
        *CALL_PIECES,
        "\n",
        *[p.replace("Paris", "Rome") for p in CALL_PIECES],
    ]
    r = _chat(client)
    assert r.choices[0].message.content == "Checking."
    assert [json.loads(c.function.arguments)["city"] for c in r.choices[0].message.tool_calls] == [
        "Paris",
        "Rome",
    ]
    streamed = list(_chat(client, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "Checking."
    assert [json.loads(a)["city"] for _, a in _streamed_calls(streamed)] == ["Paris", "Rome"]
    assert len(_chat(client, parallel_tool_calls=False).choices[0].message.tool_calls) == 1


def test_a_reply_without_a_call_is_text_and_a_broken_call_stays_text(tool_server):
    scripted, client = tool_server
    scripted.script = ["It is ", "<sunny>", " in Paris."]
    r = _chat(client)
    assert (
        r.choices[0].message.content == "It is <sunny> in Paris." and r.choices[0].message.tool_calls is None
    )
    assert r.choices[0].finish_reason == "stop"
    scripted.script = ["<tool_call>", "{broken", "</tool_call>"]
    for stream in (False, True):
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in _chat(client, stream=True) if c.choices)
        else:
            text = _chat(client).choices[0].message.content
        assert text == "<tool_call>{broken</tool_call>"


def test_tool_choice_picks_the_calls_grammar_and_earlier_calls_reach_the_template(tool_server, pipe):
    scripted, client = tool_server
    oslo = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    scripted.script = ["<tool_call>\n", oslo, "\n</tool_call>"]
    r = _chat(client, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    # the template got the tools; the generation the grammar of that function's calls, from the first token
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    assert scripted.formatted == (messages, {"tools": [WEATHER]})
    assert scripted.prompts[-1] == pipe.format_chat(messages, tools=[WEATHER])[0]
    grammar = scripted.kwargs[-1]["grammar"]
    assert grammar.root == "localspec-calls" and grammar.trigger == "" and "get_weather" in grammar.text
    _chat(client)  # auto: the same grammar, lazy (free text until the model writes <tool_call>)
    assert scripted.kwargs[-1]["grammar"].trigger == "<tool_call>"
    _chat(client, tool_choice="none")
    assert "grammar" not in scripted.kwargs[-1]
    # the turn after a call: the assistant's call (arguments as an object) and the tool's result
    scripted.script = ["It is 14 C."]
    history = [
        *messages,
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 14}'},
    ]
    r2 = _chat(client, messages=history)
    assert r2.choices[0].message.content == "It is 14 C." and r2.choices[0].message.tool_calls is None
    sent, _ = scripted.formatted
    assert sent[1]["tool_calls"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
            "id": call.id,
        }
    ]
    assert sent[2] == {"role": "tool", "content": '{"temp_c": 14}', "tool_call_id": call.id}


@pytest.mark.qwen
def test_qwen_calls_a_tool_and_answers_from_its_result():
    """The real Qwen2.5-Coder 1.5B through the server with the suffix cache: its template renders the
    tools, its reply is read as a call (streamed the same), and the next turn answers from the result."""
    from conftest import QWEN_TARGET, qwen_dir

    qwen = localspec.load(
        target=str(qwen_dir() / QWEN_TARGET), draft="none", strategy="suffix", n_threads=2, n_ctx=4096
    )
    srv = start_background(qwen, ServeOptions(port=0))
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        ask = [{"role": "user", "content": "What's the weather in Paris right now?"}]
        kw = {"model": model, "tools": [WEATHER], "temperature": 0, "max_tokens": 80}
        for choice in ("auto", "required"):
            r = client.chat.completions.create(messages=ask, tool_choice=choice, **kw)
            assert r.choices[0].message.tool_calls, r.choices[0].message
            (call,) = r.choices[0].message.tool_calls
            assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
            assert json.loads(call.function.arguments)["city"].lower().startswith("paris")
            chunks = list(client.chat.completions.create(messages=ask, tool_choice=choice, stream=True, **kw))
            assert _streamed_calls(chunks) == [(call.function.name, call.function.arguments)]
        result = {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 14, "sky": "cloudy"}'}
        r2 = client.chat.completions.create(
            messages=[*ask, r.choices[0].message.model_dump(exclude_none=True), result],
            **{**kw, "tool_choice": "none"},
        )
        assert "14" in (r2.choices[0].message.content or "")
        # the Python API reads the same call
        direct = qwen.chat(ask, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80)
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in direct.tool_calls] == [
            (call.function.name, call.function.arguments)
        ]
        pieces = list(
            qwen.chat_stream(ask, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80)
        )
        assert not any("<tool_call>" in p.content for p in pieces)
        streamed = _assembled([d for p in pieces for d in p.tool_calls])
        assert [(n, a) for _, n, a in streamed] == [(call.function.name, call.function.arguments)]
    finally:
        srv.stop()
        qwen.close()


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "two words"}}]}, "tools[0].function.name"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
        ({"functions": [{"name": "f"}]}, "functions"),
        # a JSON format would rule the calls out
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_tool_requests_are_400_naming_the_field(tool_server, kw, param):
    _, client = tool_server
    body = {"model": "tiny-target", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**body)
    assert err.value.param == param, err.value.message


# ------------------------------------------------------------------------------------------ JSON replies
PERSON_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "person",
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
    },
}


def test_response_format_makes_the_reply_that_json_streaming_and_not(client, pipe):
    messages = [{"role": "user", "content": "Who is Ada? Answer as JSON."}]
    kw = dict(model="tiny-target", messages=messages, max_tokens=200, temperature=0)
    r = client.chat.completions.create(response_format=PERSON_FORMAT, **kw)
    person = json.loads(r.choices[0].message.content)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)
    assert r.choices[0].finish_reason == "stop"
    direct = pipe.chat(messages, response_format=PERSON_FORMAT, max_tokens=200, temperature=0)
    assert r.choices[0].message.content == str(direct)
    chunks = list(client.chat.completions.create(response_format=PERSON_FORMAT, stream=True, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    anything = client.chat.completions.create(response_format={"type": "json_object"}, **kw)
    assert anything.choices[0].message.content.startswith("{")
    text = client.chat.completions.create(response_format={"type": "text"}, **kw)
    assert text.choices[0].message.content == client.chat.completions.create(**kw).choices[0].message.content


@pytest.mark.parametrize(
    ("fmt", "param"),
    [
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "array", "minItems": 10**9}}}, None),
        ("json", "response_format"),
    ],
)
def test_bad_response_formats_are_400_naming_the_field(client, fmt, param):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny-target", messages=messages, response_format=fmt)
    assert err.value.param == (param or "response_format.json_schema.schema"), err.value.message


def test_bad_json_bad_types_and_unknown_paths_get_openai_error_json(server):
    with httpx.Client(base_url=server.base) as h:
        for body, needle in [
            (b"{not json", "not valid JSON"),
            (b"[1, 2]", "object"),
            (b'{"model": "tiny-target", "prompt": 5}', "prompt"),
            (b'{"prompt": "hi"}', "model"),
            (b'{"model": "tiny-target", "prompt": "hi", "max_tokens": "9"}', "max_tokens"),
            # JSON's escapes can spell a lone surrogate, which no UTF-8 tokenizer takes: the parser refuses it
            (b'{"model": "tiny-target", "prompt": "a\\ud800b"}', "not valid JSON"),
        ]:
            r = h.post("/v1/completions", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, body
            assert needle in r.json()["error"]["message"], r.json()
        chat = b'{"model": "tiny-target", "messages": [{"role": "user", "content": "\\udcff"}]}'
        r = h.post("/v1/chat/completions", content=chat, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], r.json()
        r = h.post("/v1/completions", content=b"prompt=hi", headers={"content-type": "text/plain"})
        assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
        r = h.get("/v1/nothing")
        assert r.status_code == 404 and "no such endpoint" in r.json()["error"]["message"]
        r = h.get("/v1/chat/completions")
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
        assert "GET is not allowed on /v1/chat/completions: send a POST" in r.json()["error"]["message"]
        # DNS rebinding: a page on another origin that resolves to 127.0.0.1 sends its own Host header
        refused = h.get("/health", headers={"host": "attacker.example:8000"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "bad_host"
        assert "'attacker.example:8000'" in refused.json()["error"]["message"]
        for host in ("localhost:1", "127.0.0.1", "[::1]:8000", "LOCALHOST"):
            assert h.get("/health", headers={"host": host}).json()["status"] == "ok", host
        assert h.get("/health").json()["status"] == "ok"


def test_metrics_are_prometheus_text(server, client):
    _complete(client, PROMPTS[5], max_tokens=8)
    before = httpx.get(server.base + "/metrics").text
    with pytest.raises(openai.NotFoundError):  # a request refused before queueing is counted as refused
        client.completions.create(model="gpt-4o", prompt="hi", max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny-target", messages=[], max_tokens=-1)
    r = httpx.get(server.base + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    assert samples['localspec_requests_total{endpoint="completions",outcome="ok"}'] >= 1
    for endpoint in ("completions", "chat"):
        name = f'localspec_requests_total{{endpoint="{endpoint}",outcome="refused"}}'
        was = next((float(x.rsplit(" ", 1)[1]) for x in before.splitlines() if x.startswith(name + " ")), 0)
        assert samples[name] == was + 1, endpoint
    assert samples["localspec_generated_tokens_total"] >= 8
    assert 0 < samples["localspec_accepted_tokens_total"] <= samples["localspec_drafted_tokens_total"]
    assert 0 < samples["localspec_acceptance_ratio"] <= 1
    assert samples["localspec_queue_length"] == 0
    assert "# TYPE localspec_tokens_per_second gauge" in r.text


# ------------------------------------------------------------------------------------------ concurrency
def test_eight_concurrent_clients_each_get_their_sequential_answer(client):
    def ask(i: int, stream: bool) -> str:
        if i % 2:  # half chat, half plain completions
            messages = [{"role": "user", "content": PROMPTS[i]}]
            kw = dict(model="tiny-target", messages=messages, max_tokens=48, temperature=0)
            if stream:
                chunks = client.chat.completions.create(**kw, stream=True)
                return "".join(c.choices[0].delta.content or "" for c in chunks)
            return client.chat.completions.create(**kw).choices[0].message.content
        if stream:
            return "".join(
                c.choices[0].text for c in _complete(client, PROMPTS[i], max_tokens=48, stream=True)
            )
        return _complete(client, PROMPTS[i], max_tokens=48).choices[0].text

    reference = [ask(i, stream=False) for i in range(8)]
    assert len(set(reference)) == 8  # distinct answers, so a mix-up would show
    got: dict[int, str] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            barrier.wait()
            got[i] = ask(i, stream=i < 4)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert [got.get(i) for i in range(8)] == reference


def test_a_client_that_disconnects_cancels_its_generation_and_leaves_a_clean_state():
    real = _load()
    slow = SlowPipe(real, delay=0.01)  # 400 tokens would take 4 s
    srv = start_background(slow, ServeOptions(port=0))
    try:
        body = {
            "model": "tiny-target",
            "prompt": PROMPTS[6],
            "max_tokens": 400,
            "temperature": 0,
            "stream": True,
        }
        with httpx.Client(base_url=srv.base, timeout=30) as h:
            with h.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                events = (line for line in r.iter_lines() if line)
                for _ in range(3):
                    assert next(events).startswith("data: ")
            # the connection is closed here, mid-stream
            deadline = time.monotonic() + 5
            while srv.app.state.worker.busy and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not srv.app.state.worker.busy
            assert slow.produced < 100, f"generation went on for {slow.produced} tokens after the client left"
            metrics = h.get("/metrics").text
            assert 'localspec_requests_total{endpoint="completions",outcome="cancelled"} 1' in metrics
        client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0)
        after = _complete(client, PROMPTS[7], max_tokens=48).choices[0].text
        after_chat = (
            client.chat.completions.create(
                model="tiny-target",
                messages=[{"role": "user", "content": PROMPTS[6]}],
                max_tokens=48,
                temperature=0,
            )
            .choices[0]
            .message.content
        )
    finally:
        srv.stop()
        real.close()
    with _load() as fresh:
        assert after == str(fresh.generate(PROMPTS[7], max_tokens=48, temperature=0))
    with _load() as fresh:
        assert after_chat == str(
            fresh.chat([{"role": "user", "content": PROMPTS[6]}], max_tokens=48, temperature=0)
        )


def test_an_abandoned_stream_writes_no_burst_to_its_dead_socket(server, caplog):
    """A client that resets its connection mid-stream (the soak's abandoned streams): the tokens of the step
    in flight are not all written to the dead socket. They were (no turn of the event loop between two
    chunks), and asyncio logged "socket.send() raised exception." for about one abandoned stream in five."""
    import socket
    import struct

    host, port = server.base.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(
        {"model": "tiny-target", "prompt": PROMPTS[3], "max_tokens": 300, "temperature": 0, "stream": True}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    caplog.set_level("WARNING", logger="asyncio")
    for _ in range(40):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head + body)
            seen = b""
            while seen.count(b"data: ") < 3:
                seen += sock.recv(65536)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
    deadline = time.monotonic() + 5
    while server.app.state.worker.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server.app.state.worker.busy
    said = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not said, said[:3]


def test_a_full_queue_answers_429_with_retry_after():
    real = _load()
    slow = SlowPipe(real, delay=0.01)
    srv = start_background(slow, ServeOptions(port=0, max_queue=1))
    client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=30)
    try:
        running = _complete(client, PROMPTS[0], max_tokens=300, stream=True)  # holds the worker
        next(iter(running))
        waiting: list = []
        t = threading.Thread(target=lambda: waiting.append(_complete(client, PROMPTS[1], max_tokens=4)))
        t.start()
        deadline = time.monotonic() + 5
        while srv.app.state.worker.waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as err:
            _complete(client, PROMPTS[2], max_tokens=4)
        assert int(err.value.response.headers["retry-after"]) >= 1
        assert err.value.code == "queue_full"
        running.close()  # the first client leaves; the waiting one is served
        t.join(10)
        assert waiting and waiting[0].choices[0].text
    finally:
        srv.stop()
        real.close()


# ------------------------------------------------------------------------------------------ security
def test_a_non_loopback_bind_without_a_key_is_refused(pipe):
    with pytest.raises(ExposureError) as err:
        start_background(pipe, ServeOptions(host="0.0.0.0", port=0))
    assert "--api-key" in err.value.hint


def test_cli_refuses_an_exposed_bind_before_loading_and_reads_the_key_from_the_environment(monkeypatch):
    from click.testing import CliRunner

    from localspec.cli import main
    from localspec.serve import app as server

    r = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--port", "0"], env={"LOCALSPEC_API_KEY": ""})
    assert r.exit_code == 1
    assert "refusing to expose the HTTP API" in r.output and "--api-key" in r.output

    seen = {}
    monkeypatch.setattr(server, "serve", lambda pipe, opts, **kw: seen.update(opts=opts, n_ctx=pipe.n_ctx))
    r = CliRunner().invoke(
        main, ["serve", "--host", "0.0.0.0", "--n-ctx", "512"], env={"LOCALSPEC_API_KEY": "from-env"}
    )
    assert r.exit_code == 0, r.output
    assert seen["opts"].api_key == "from-env" and seen["n_ctx"] == 512
    assert seen["opts"].aliases == ("tiny-embedded",)


def test_a_wrong_or_missing_key_gets_401_and_the_right_one_works(pipe):
    srv = start_background(pipe, ServeOptions(port=0, api_key="s3cret-key", max_body_bytes=4096))
    try:
        wrong = openai.OpenAI(base_url=srv.url, api_key="s3cret-kez", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            wrong.completions.create(model="tiny-target", prompt="hi", max_tokens=4)
        assert err.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        assert httpx.get(srv.base + "/metrics").status_code == 401
        assert httpx.get(srv.base + "/v1/models", headers={"authorization": "s3cret-key"}).status_code == 401
        assert httpx.get(srv.base + "/health").status_code == 200  # says nothing but "ok"

        right = openai.OpenAI(base_url=srv.url, api_key="s3cret-key", max_retries=0)
        assert _complete(right, PROMPTS[0], max_tokens=4).choices[0].text
        # the body limit holds before anything is parsed, with or without a declared length
        big = {"model": "tiny-target", "prompt": "x" * 5000}
        with pytest.raises(openai.APIStatusError) as err:
            right.completions.create(**big, max_tokens=4)
        assert err.value.status_code == 413
        chunked = httpx.post(
            srv.base + "/v1/completions",
            content=iter([b'{"model": "tiny-target", "prompt": "', b"x" * 5000, b'"}']),
            headers={"authorization": "Bearer s3cret-key", "content-type": "application/json"},
        )
        assert chunked.status_code == 413 and "4096 bytes" in chunked.json()["error"]["message"]
    finally:
        srv.stop()


def test_stopping_the_server_ends_a_running_stream_with_an_error_at_once():
    real = _load()
    slow = SlowPipe(real, delay=0.01)  # 400 tokens would take 4 s
    srv = start_background(slow, ServeOptions(port=0))
    try:
        body = {
            "model": "tiny-target",
            "prompt": PROMPTS[6],
            "max_tokens": 400,
            "temperature": 0,
            "stream": True,
        }
        with (
            httpx.Client(base_url=srv.base, timeout=30) as h,
            h.stream("POST", "/v1/completions", json=body) as r,
        ):
            events = (line for line in r.iter_lines() if line)
            assert next(events).startswith("data: ")
            t0 = time.monotonic()
            stopper = threading.Thread(target=srv.stop)
            stopper.start()
            rest = list(events)
            stopper.join(30)
            assert time.monotonic() - t0 < 3
        assert "the server is shutting down" in rest[-1] and "[DONE]" not in rest[-1]
        assert slow.produced < 200
    finally:
        srv.stop()
        real.close()


@pytest.mark.parametrize("stream", [False, True])
def test_the_answer_is_complete_before_the_generation_is_cleaned_up(stream):
    """What the engine does after the last token (the KV cache put right, the suffix cache fed: at times a
    second or more) happens after the client has its whole answer, and before the next job starts."""
    real = _load()
    learning = LearningPipe(real)
    srv = start_background(learning, ServeOptions(port=0))
    client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=30)
    try:
        t0 = time.monotonic()
        if stream:
            text = "".join(c.choices[0].text for c in _complete(client, PROMPTS[0], stream=True) if c.choices)
        else:
            text = _complete(client, PROMPTS[0]).choices[0].text
        took = time.monotonic() - t0
        assert text and not learning.release.is_set() and took < 20
        assert learning.closing.wait(10)  # the cleanup runs (and holds the worker) after the answer
        second: list = []
        t = threading.Thread(target=lambda: second.append(_complete(client, PROMPTS[1]).choices[0].text))
        t.start()
        time.sleep(0.3)
        assert not second, "the next job started before the last one was cleaned up"
        learning.release.set()
        t.join(30)
        assert second and second[0]
    finally:
        learning.release.set()
        srv.stop()
        real.close()
    with _load() as fresh:
        assert text == str(fresh.generate(PROMPTS[0], max_tokens=40, temperature=0))


class BuggyPipe:
    """The real pipeline whose tokenizer has a bug."""

    def __init__(self, pipe) -> None:
        self._pipe = pipe

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def tokenize(self, text):
        raise RuntimeError("a bug")


def test_a_bug_answers_500_json_and_the_connection_stays_usable(pipe, caplog):
    srv = start_background(BuggyPipe(pipe), ServeOptions(port=0))
    try:
        with httpx.Client(base_url=srv.base, timeout=30) as h:
            for _ in range(2):  # the same keep-alive connection, twice
                r = h.post("/v1/completions", json={"model": "tiny-target", "prompt": "hi", "max_tokens": 2})
                assert r.status_code == 500
                assert r.json()["error"]["message"] == "internal error (RuntimeError); see the server's log"
            assert h.get("/health").status_code == 200
    finally:
        srv.stop()
    assert "request failed" in caplog.text and "a bug" in caplog.text


def test_an_error_while_cleaning_up_is_logged_and_the_server_goes_on(caplog):
    real = _load()
    srv = start_background(LearningPipe(real, fail=True), ServeOptions(port=0))
    client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=30)
    try:
        with caplog.at_level("ERROR", logger="localspec.serve.app"):
            first = _complete(client, PROMPTS[0]).choices[0].text
            second = _complete(client, PROMPTS[1]).choices[0].text
        assert first and second
        assert "closing a finished generation failed" in caplog.text
    finally:
        srv.stop()
        real.close()


def test_a_5xx_from_a_library_error_is_the_servers_state_not_the_request():
    """The 503 for a lost rpc-server said "invalid_request_error" while every other 503 says server_error."""
    from localspec.errors import RpcError, SettingsError
    from localspec.serve.schemas import from_localspec

    lost = from_localspec(RpcError("RPC server 127.0.0.1:1 stopped", hint="restart it"), 503).body()["error"]
    assert lost["type"] == "server_error" and lost["message"] == "RPC server 127.0.0.1:1 stopped (restart it)"
    refused = from_localspec(SettingsError("n_max 0", hint="1-64")).body()["error"]
    assert refused["type"] == "invalid_request_error"
