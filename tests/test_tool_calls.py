"""Tool calls: requests' tools checked, calls read out of a reply whole and streamed piece by piece."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localspec.errors import MessageError
from localspec.pipeline.chat_turns import chat_messages, template_calls, template_messages
from localspec.pipeline.tool_calls import tool_use
from localspec.pipeline.tool_reader import CallSplitter, may_start_fenced_call, split_calls
from localspec.pipeline.tool_schema import (
    HERMES,
    MAX_TOOLS,
    ToolCallError,
    check_choice,
    check_tools,
    template_format,
)

#: enough of a Qwen2.5-style template for localspec to know its tool-call format (the embedded pair's own
#: template has none)
TOOL_TEMPLATE = "{% if tools %}<tools>{{ tools | tojson }}</tools> <tool_call>{% endif %}"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _plain(calls):
    return [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_the_format_is_recognised_from_the_template():
    qwen_like = "{%- if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>" + (
        "<tool_call>{%- endif %}"
    )
    assert template_format(qwen_like) == HERMES
    assert template_format("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert template_format("{{ tools }} [TOOL_CALLS]") is None  # another format: not read
    assert template_format(None) is None


def test_tools_are_checked_field_by_field():
    (tool,) = check_tools([WEATHER])
    assert tool == WEATHER
    bare = check_tools([{"type": "function", "function": {"name": "now"}}])
    assert bare[0]["function"] == {"name": "now", "parameters": {"type": "object", "properties": {}}}
    bad = [
        ([], "tools"),
        ([{"type": "retrieval"}], "tools[0]"),
        ([{"type": "function"}], "tools[0].function"),
        ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name"),
        ([WEATHER, WEATHER], "tools[1].function.name"),
        (
            [{"type": "function", "function": {"name": "f", "description": 3}}],
            "tools[0].function.description",
        ),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], "tools[0].function.parameters"),
        ([{"type": "function", "function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)], "tools"),
    ]
    for tools, param in bad:
        with pytest.raises(ToolCallError) as err:
            check_tools(tools)
        assert err.value.param == param, (tools, err.value)


def test_tool_choice_picks_the_grammar_of_the_calls():
    tools = check_tools([WEATHER, CLOCK])
    assert check_choice(None, tools) == "auto" and check_choice("none", tools) == "none"
    template = "{{ tools }} <tool_call>"
    auto = tool_use([WEATHER, CLOCK], None, template).grammar
    assert auto is not None and auto.trigger == "<tool_call>" and auto.root == "localspec-calls"
    assert '"\\"get_weather\\""' in auto.text and '"\\"get_time\\""' in auto.text
    required = tool_use([WEATHER, CLOCK], "required", template).grammar
    assert required is not None and required.trigger == "" and required.text == auto.text
    named = tool_use([WEATHER, CLOCK], {"type": "function", "function": {"name": "get_time"}}, template)
    assert named.grammar is not None and "get_weather" not in named.grammar.text
    assert tool_use([WEATHER], "none", template).grammar is None
    one = tool_use([WEATHER], "required", template, parallel=False).grammar
    assert one is not None and one.text.rstrip().endswith('"\\n</tool_call>"')
    with pytest.raises(ToolCallError, match="not in tools") as err:
        check_choice({"type": "function", "function": {"name": "launch"}}, tools)
    assert "get_weather" in (err.value.hint or "")
    with pytest.raises(ToolCallError):
        check_choice("always", tools)


def test_parameters_that_cannot_become_a_grammar_name_the_function():
    deep: dict = {"type": "string"}
    for _ in range(50):
        deep = {"type": "array", "items": deep}
    for params, param in [
        (deep, "tools[1].function.parameters"),
        ({"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}}, "tools"),
    ]:
        bad = {"type": "function", "function": {"name": "bad", "parameters": params}}
        with pytest.raises(ToolCallError) as err:
            tool_use([WEATHER, bad], "auto", "{{ tools }} <tool_call>")
        assert err.value.param == param, err.value


def test_earlier_calls_are_given_to_the_template_with_arguments_as_objects():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1, 2]}'}}]
    assert template_calls(calls, "m") == [
        {"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2]}}, "id": "call_1"}
    ]
    with pytest.raises(ToolCallError) as err:
        template_calls([{"function": {"name": "f", "arguments": "{not json"}}], "messages[2].tool_calls")
    assert err.value.param == "messages[2].tool_calls[0].function.arguments"
    with pytest.raises(ToolCallError):
        template_calls("f()", "m")
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    shaped = template_messages(history)
    assert shaped[1]["tool_calls"][0]["function"]["arguments"] == {"a": [1, 2]}
    assert shaped[0] is history[0] and shaped[2] is history[2] and history[1]["tool_calls"] is calls
    with pytest.raises(ToolCallError) as err:
        template_messages([history[0], {"role": "assistant", "tool_calls": [{"function": {}}]}])
    assert err.value.param == "messages[1].tool_calls[0]"
    deep = "[" * 100_000 + "]" * 100_000  # deeper than Python's JSON reader recurses: refused, not a crash
    with pytest.raises(ToolCallError, match="nested too deeply"):
        template_calls([{"function": {"name": "f", "arguments": deep}}], "m")
    reply = '<tool_call>{"name": "f", "arguments": ' + deep + "}</tool_call>"
    assert split_calls(reply) == (reply, [])


def test_calls_are_read_out_of_a_reply():
    text, calls = split_calls(CALL)
    assert text == "" and _plain(calls) == [("function", "get_weather", {"city": "Paris"})]
    assert calls[0]["id"].startswith("call_")
    two = "Checking both.\n" + CALL + "\n" + CALL.replace("Paris", "Rome")
    text, calls = split_calls(two)
    assert text == "Checking both." and [c[2]["city"] for c in _plain(calls)] == ["Paris", "Rome"]
    assert len({c["id"] for c in calls}) == 2
    # not a call: the text stays as it was
    for broken in (
        "<tool_call>\n{oops}\n</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        "<tool_call>",
    ):
        assert split_calls(broken) == (broken.strip(), [])
    # a reply that ended right after the JSON (no closing tag) still called
    _, calls = split_calls(CALL.removesuffix("</tool_call>"))
    assert len(calls) == 1
    # arguments the model wrote as a string are passed on as they are
    _, calls = split_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert calls[0]["function"]["arguments"] == '{"a": 1}'


FENCED = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'


def test_a_reply_that_is_one_fenced_json_call_of_a_declared_function_is_that_call():
    """What Qwen2.5-Coder 1.5B writes for a tool it was given, instead of the tag."""
    names = ["get_weather"]
    text, calls = split_calls("\n" + FENCED + "\n", names)
    assert text == "" and _plain(calls) == [("function", "get_weather", {"city": "Paris"})]
    bare = (
        '{"name": "get_weather", "arguments": {"city": "Paris"}}'  # (and bare, as it wrote in an agent loop)
    )
    assert _plain(split_calls(bare, names)[1]) == _plain(calls)
    for not_a_call in (
        FENCED,  # no functions declared: text
        "Here is an example:\n" + FENCED,  # not the whole reply
        FENCED.replace("get_weather", "rm_rf"),  # not a declared function
        FENCED.replace('"arguments"', '"args"'),
        '```python\n{"name": "get_weather", "arguments": {}}\n```',
        '```json\n{"name": "get_weather", "arguments": {}}',  # a fence opened and not closed
        '{"name": "get_weather", "arguments": {}} and more',
    ):
        assert split_calls(not_a_call, names if not_a_call is not FENCED else ())[1] == []


def test_a_stream_holds_a_reply_back_only_while_it_may_be_a_fenced_call():
    assert may_start_fenced_call("``") and may_start_fenced_call("```js") and may_start_fenced_call("```\n{")
    assert may_start_fenced_call('```json\n{\n  "na') and may_start_fenced_call('```json {"name": "f"')
    assert not may_start_fenced_call("```python\n") and not may_start_fenced_call('```json\n{"city"')
    assert not may_start_fenced_call("Sure") and not may_start_fenced_call("```json\n[")
    assert (
        may_start_fenced_call("{")
        and may_start_fenced_call('{\n  "na')
        and not may_start_fenced_call('{"city"')
    )
    code = CallSplitter(["get_weather"])
    assert code.feed("```") == "" and code.feed("python\nx = 1") == "```python\nx = 1"


PIECES = ["Sure", " ", "\n", "<tool_call>", "</tool_call>", CALL, "<tool", "_call>", "<", "x", "é", "{"]
PIECES += ["```", "json", '{"name": "get_weather", ', '"arguments": {}}', FENCED, "}", '"', "\\", ", "]
PIECES += ['{"a": "</tool_call>"', '"arguments": {"b": [1, {"c": "}"}]}', '{"arguments": {}, "name": "f"}']


def _assembled(entries: list[dict]) -> list[tuple[str, str, str]]:
    """Streamed tool_calls entries put together as a client does: by index, arguments appended."""
    calls: dict[int, dict] = {}
    for e in entries:
        c = calls.setdefault(e["index"], {"id": None, "name": None, "arguments": ""})
        c["id"] = e.get("id", c["id"])
        c["name"] = e.get("function", {}).get("name", c["name"])
        c["arguments"] += e.get("function", {}).get("arguments", "")
    return [(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())]


@given(st.lists(st.sampled_from(PIECES), max_size=12), st.data(), st.booleans(), st.booleans())
def test_a_streamed_reply_adds_up_to_the_whole_reply(parts, data, declared, parallel):
    """However the reply is cut into pieces, the text sent piece by piece plus what finish returns is
    split_calls' text, the streamed call entries put together are exactly the calls (ids and arguments as
    split_calls reads them), and nothing after an opening tag is sent as text."""
    reply = "".join(parts)
    names = ["get_weather"] if declared else []
    cuts = sorted(data.draw(st.lists(st.integers(0, len(reply)), max_size=6)))
    pieces = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
    splitter = CallSplitter(names, parallel=parallel)
    sent, entries = "", []
    for piece in pieces:
        out = splitter.feed(piece)
        sent += out
        entries += splitter.take_deltas()
        assert "<tool_call>" not in sent
    rest, calls = splitter.finish()
    entries += splitter.take_deltas()
    text, whole = split_calls(reply, names)
    assert sent + rest == text
    assert [(n, a) for _, n, a in _assembled(entries)] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in (whole if parallel else whole[:1])
    ]
    assert [i for i, _, _ in _assembled(entries)] == [c["id"] for c in calls]


def test_a_started_call_streams_its_name_then_its_arguments_as_written():
    s = CallSplitter(["get_weather"])
    assert s.feed("<tool_call>\n") == "" and s.take_deltas() == []
    s.feed('{"name": "get_weather", "argu')
    assert s.take_deltas() == []  # the start is not complete yet
    s.feed('ments": {"city": "Pa')
    (first,) = s.take_deltas()
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"] == {"name": "get_weather", "arguments": '{"city": "Pa'}
    s.feed('ris, </tool_call> too"}}\n</tool_call>')  # the tag inside a string is the argument's text
    assert s.take_deltas() == [{"index": 0, "function": {"arguments": 'ris, </tool_call> too"}'}}]
    rest, calls = s.finish()
    assert rest == "" and s.take_deltas() == []
    assert calls[0]["id"] == first["id"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris, </tool_call> too"}
    # cut short (max_tokens): still the call, with what was written of its arguments
    cut = CallSplitter()
    cut.feed('<tool_call>\n{"name": "f", "arguments": {"a": 1')
    assert cut.finish()[1][0]["function"]["arguments"] == '{"a": 1'
    assert split_calls('<tool_call>\n{"name": "f", "arguments": {"a": 1')[1][0]["function"]["name"] == "f"


def test_a_stream_holds_back_only_what_may_start_a_call():
    s = CallSplitter()
    assert s.feed("  Hello") == "Hello"  # leading whitespace waits (a call may follow it), then goes
    assert s.feed(" world <tool") == " world"
    assert s.feed("s are fun") == " <tools are fun"
    assert s.feed("\n" + CALL) == ""
    rest, calls = s.finish()
    assert rest == "" and len(calls) == 1


@pytest.mark.parametrize(
    ("messages", "param", "said"),
    [
        (None, "messages", "must be a list of turns, got NoneType"),
        ("hello", "messages", "got str"),
        ({"role": "user", "content": "hi"}, "messages", "got dict"),
        ([], "messages", "is empty"),
        (["hello"], "messages[0]", "must be a dict with role and content, got str"),
        ([{"content": "hi"}], "messages[0].role", "got None"),
        ([{"role": "bogus", "content": "hi"}], "messages[0].role", "got 'bogus'"),
        ([{"role": "user", "content": 5}], "messages[0].content", "string or a list of text parts, got int"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content", "only text parts"),
        ([{"role": "user", "content": "a\udcffb"}], "messages[0].content", "not valid UTF-8 text: byte 0xff"),
    ],
)
def test_chat_messages_refuse_what_a_template_would_choke_on_or_silently_drop(messages, param, said):
    """Qwen's template renders no turn of an unknown role (the reply then answers the system prompt
    alone); others fail inside Jinja. Both the API and the server check messages here."""
    with pytest.raises(MessageError) as err:
        chat_messages(messages)
    assert err.value.param == param and said in err.value.message, err.value.message


def test_chat_messages_take_openai_shapes_as_templates_want_them():
    shaped = chat_messages(
        (
            {
                "role": "developer",
                "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            },
            {"role": "user"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "3", "name": "f"},
        )
    )
    assert shaped == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": ""},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}],
        },
        {"role": "tool", "content": "3", "tool_call_id": "call_1"},
    ]


def test_a_chat_request_runs_one_grammar_and_refuses_a_second():
    from localspec.constrain.grammar import Grammar
    from localspec.errors import GrammarError
    from localspec.pipeline.tool_calls import ToolUse

    mine = Grammar.json_object()
    plain = ToolUse()
    assert plain.request_grammar(None, mine) is mine and plain.request_grammar(None, None) is None
    assert plain.request_grammar({"type": "json_object"}, None) == Grammar.json_object()
    with pytest.raises(GrammarError, match="cannot be given with response_format"):
        plain.request_grammar({"type": "json_object"}, mine)
