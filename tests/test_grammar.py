"""Constrained output: grammars from JSON schemas and GBNF, checked; the target's token under a grammar,
computed three ways that must agree; every strategy giving the target alone's constrained output."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _chi2 import chi2_pvalue
from _lossless import assert_lossless, traced
from hypothesis import given
from hypothesis import strategies as st

from localspec import Grammar
from localspec.constrain.grammar import Constraint, reply_grammar, response_format_grammar
from localspec.constrain.number_ranges import Bound, integer_range, number_range
from localspec.errors import GrammarError, SettingsError
from localspec.llama.sampling import SamplingParams, distribution

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
#: A small grammar the tiny model must be forced through: a list of 1-3 lowercase words.
WORDS = r"""root ::= "[" word ("," " "? word){0,2} "]"
word ::= "\"" [a-z]{1,8} "\""
"""


# ------------------------------------------------------------------------------------------ grammars
def test_response_format_maps_onto_grammars_and_names_the_bad_field():
    assert response_format_grammar(None) is None
    assert response_format_grammar({"type": "text"}) is None
    assert response_format_grammar({"type": "json_object"}) == Grammar.json_object()
    g = response_format_grammar({"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    assert g is not None and '"\\"age\\""' in g.text and g.what == "response_format.json_schema.schema"
    bad = [
        ("json", "response_format"),
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": []}}, "response_format.json_schema.schema"),
    ]
    for value, param in bad:
        with pytest.raises(GrammarError) as err:
            response_format_grammar(value)
        assert err.value.param == param and err.value.hint
    with pytest.raises(GrammarError, match="tools"):
        reply_grammar({"type": "json_object"}, reads_calls=True)
    assert reply_grammar({"type": "text"}, reads_calls=True) is None


@pytest.mark.parametrize(
    ("schema", "match"),
    [
        ({"type": "array", "minItems": 10**9}, "minItems"),
        ({"type": "string", "maxLength": 5000}, "maxLength"),
        ({"type": "string", "pattern": "^a{100000}$"}, "repeat"),
        ({"type": "string", "pattern": "^a{1,99999}$"}, "repeat"),
        ({"$ref": "https://example.com/schema.json"}, "cannot be turned"),
        ({"properties": {"x": {"$ref": "#/$defs/missing"}}}, r"'#/\$defs/missing' points at nothing"),
        ({"not": {"type": "string"}}, "nothing a grammar can hold: \\{'not'"),
        ({"type": "object", "description": "x" * 70000}, "characters"),
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "type 'strin', which is not a JSON"),
        ({"type": ["string", "nul"]}, "type 'nul'"),
        # nothing can match these; the converter drops or garbles a bound and the output broke the schema
        ({"type": "integer", "minimum": 10, "maximum": 1}, "minimum 10 is more than its maximum 1"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength 5 is more than its maxLength 2"),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1}, "minItems 3"),
        ({"type": "number", "minimum": float("nan")}, "minimum is nan"),
        ({"enum": []}, "enum is empty"),
        # what the converter drops without a word: refused rather than broken in the output
        ({"type": "integer", "multipleOf": 7}, "multipleOf"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "minProperties": 2}, "minProperties"),
        ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "allOf is held only as object parts"),
        ({"type": "string", "minimum": 0}, "only the bounds of one integer or number type"),
        ({"type": ["integer", "null"], "minimum": 1}, "only the bounds of one integer or number"),
        ({"type": "number", "minimum": 1, "exclusiveMaximum": 1}, "leave no number"),
        ({"type": "number", "exclusiveMinimum": 2.5, "maximum": 2.5}, "leave no number"),
        ({"type": "integer", "minimum": 1.5, "maximum": 1.9}, "leave no integer"),
        ({"type": "object", "properties": {"a": {"anyOf": []}}}, "anyOf is empty"),
        # a keyword of the wrong kind (the soak's bad schemas): "required": "name" was read as the
        # properties n, a, m and e and the request answered 200; others crashed the converter
        ({"type": "object", "required": "name"}, r"required is a string \("),
        ({"type": "object", "required": ["a", 1]}, "required is an array"),
        ({"type": "object", "properties": "x"}, "properties is a string"),
        ({"type": "array", "items": 3}, "items is a number"),
        ({"type": "object", "additionalProperties": 3}, "additionalProperties is a number"),
        ({"anyOf": {"type": "string"}}, "anyOf is an object"),
        ({"type": "string", "pattern": 5}, "pattern is a number"),
        # a pattern the grammar cannot hold: "^($" became the empty string, and the reply broke the schema
        ({"type": "string", "pattern": "^($"}, "not a regular expression"),
        ({"type": "string", "pattern": "[a-z]+"}, "not anchored"),
    ],
)
def test_hostile_schemas_are_refused_before_conversion(schema, match):
    with pytest.raises(GrammarError, match=match) as err:
        Grammar.json_schema(schema)
    assert err.value.param == "response_format.json_schema.schema"


def test_keywords_named_as_properties_are_names_not_keywords():
    """The shape checks read keywords of a schema, never the names in its ``properties``."""
    schema = {
        "type": "object",
        "properties": {"required": {"type": "string"}, "pattern": {"type": "integer"}},
        "required": ["required", "pattern"],
        "additionalProperties": False,
    }
    assert "root ::=" in Grammar.json_schema(schema).text


def _range_regex(lo, hi):
    import re

    alternatives = (
        re.escape(sign) + "".join(f"[{a}-{b}]" for a, b in digits) for sign, digits in integer_range(lo, hi)
    )
    return re.compile("|".join(alternatives))


@given(
    st.one_of(st.none(), st.integers(-(10**7), 10**7)),
    st.one_of(st.none(), st.integers(-(10**7), 10**7)),
    st.lists(st.integers(-(10**8), 10**8), max_size=50),
)
def test_an_integer_range_matches_exactly_its_integers_as_json_writes_them(lo, hi, samples):
    """Against the brute force: every integer near either bound and some anywhere, each written as JSON does
    (no leading zero, no -0); the GBNF is the same patterns, one digit class per position."""
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    rx = _range_regex(lo, hi)
    near = [b + d for b in (lo, hi, 0) if b is not None for d in range(-25, 26)]
    for v in near + samples:
        assert bool(rx.fullmatch(str(v))) == ((lo is None or v >= lo) and (hi is None or v <= hi)), (
            lo,
            hi,
            v,
        )
    assert not rx.fullmatch("-0") and not rx.fullmatch("01")


def _number_regex(lo, hi):
    import re

    def run(r):
        low, high, fewest, most = r
        return f"[{low}-{high}]{{{fewest},{most}}}"

    alternatives = []
    for sign, digits, bare, fractions in number_range(lo, hi):
        head = re.escape(sign) + "".join(f"[{a}-{b}]" for a, b in digits)
        if fractions:
            dot = r"\.(?:" + "|".join("".join(run(r) for r in p) for p in fractions) + ")"
            head += f"(?:{dot})" + ("?" if bare else "")
        alternatives.append(head)
    return re.compile("|".join(alternatives) or "(?!)")


_DECIMAL = st.decimals(min_value=-1000, max_value=1000, places=3, allow_nan=False, allow_infinity=False)
_BOUND = st.one_of(st.none(), st.builds(Bound, _DECIMAL, st.booleans()))


def _spellings(value):
    """``value`` as JSON may write it without an exponent: the shortest form and with trailing zeros."""
    from decimal import Decimal

    text = format(Decimal(value).normalize(), "f")
    whole, _, fraction = text.partition(".")
    whole = whole.lstrip("-") or "0"
    sign = "-" if Decimal(value) < 0 else ""
    out = {sign + whole + (f".{fraction}" if fraction else "")}
    out |= {sign + whole + "." + fraction + "0" * k for k in (1, 2) if len(fraction) + k <= 16}
    return out


@given(_BOUND, _BOUND, st.lists(_DECIMAL, max_size=20))
def test_a_number_range_matches_exactly_its_numbers_as_json_writes_them(lo, hi, samples):
    """Against comparing the numbers themselves: every spelling of values at and near either bound (steps of
    1 to 0.0001 either way) and some anywhere; never "-0" or "-0.0"; the GBNF is the same patterns."""
    from decimal import Decimal

    rx = _number_regex(lo, hi)
    points = [b.value for b in (lo, hi) if b is not None] + [Decimal(0)]
    near = [p + k * Decimal(10) ** -j for p in points for j in range(5) for k in (-3, -1, 0, 1, 3)]
    for v in near + samples:
        inside = (lo is None or v > lo.value or (v == lo.value and lo.inclusive)) and (
            hi is None or v < hi.value or (v == hi.value and hi.inclusive)
        )
        for text in _spellings(v):
            assert bool(rx.fullmatch(text)) == inside, (lo, hi, text)
    for zero in ("-0", "-0.0", "00", "01.5", "1.", ".5"):
        assert not rx.fullmatch(zero), (lo, hi, zero)


def test_number_bounds_hold_in_the_output(embedded_pipe):
    """Bounds on "type": "number" were refused; now held like the integers' (the toy model writes long digit
    runs when it may)."""
    from decimal import Decimal

    for schema, low, high in (
        ({"type": "number", "minimum": 0, "maximum": 1}, 0, 1),
        ({"type": "number", "exclusiveMinimum": -2.5, "maximum": -0.25}, -2.5, -0.25),
        ({"type": "number", "minimum": 100.125}, 100.125, None),
    ):
        for prompt in ("The number is", "x = 999999", "-1000000000", "0."):
            text = str(embedded_pipe.generate(prompt, max_tokens=30, grammar=Grammar.json_schema(schema)))
            value = Decimal(text.strip())
            assert low <= value and (high is None or value <= high), (schema, prompt, text)
            assert value != Decimal("-2.5"), text  # exclusive
    scored = {"type": "object", "properties": {"p": {"type": "number", "maximum": 0.5}}, "required": ["p"]}
    text = str(embedded_pipe.generate("{", max_tokens=40, grammar=Grammar.json_schema(scored)))
    assert json.loads(text)["p"] <= 0.5, text


def test_integer_bounds_hold_in_the_output(embedded_pipe):
    """The converter left integer bounds out ("TODO"); the toy model writes long digit runs when it may."""
    for schema, ok in (
        ({"type": "integer", "minimum": 1, "maximum": 5}, range(1, 6)),
        ({"type": "integer", "minimum": -20, "exclusiveMaximum": -3}, range(-20, -3)),
        ({"type": "integer", "exclusiveMinimum": 99.5, "maximum": 1000}, range(100, 1001)),
    ):
        for prompt in ("The number is", "x = 999999", "-1000000000"):
            text = str(embedded_pipe.generate(prompt, max_tokens=24, grammar=Grammar.json_schema(schema)))
            assert int(json.loads(text)) in ok, (schema, prompt, text)
    bounded = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}, "required": ["n"]}
    text = str(embedded_pipe.generate("{", max_tokens=40, grammar=Grammar.json_schema(bounded)))
    assert json.loads(text)["n"] <= 9, text


def test_a_type_key_inside_data_or_as_a_property_name_is_not_a_type():
    schema = {"type": "object", "properties": {"type": {"type": "string"}}, "default": {"type": "x"}}
    bounds_as_names = {
        "type": "object",
        "properties": {
            "minimum": {"type": "integer"},
            "enum": {"type": "array"},
            "contains": {"type": "string"},
        },
    }
    assert "root" in Grammar.json_schema(bounds_as_names).text
    assert "root" in Grammar.json_schema(schema).text


def test_a_schema_nested_past_the_bound_or_past_python_is_refused_not_a_crash():
    deep: dict = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarError, match="nests"):
        Grammar.json_schema(deep)
    for _ in range(100_000):  # json.dumps itself runs out of stack here
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarError):
        Grammar.json_schema(deep)


def test_gbnf_text_is_checked_and_a_broken_one_fails_when_the_generation_is_asked_for(embedded_pipe, capfd):
    for text in ("", "   ", 7):
        with pytest.raises(GrammarError):
            Grammar.gbnf(text)  # type: ignore[arg-type]
    with pytest.raises(GrammarError, match="characters"):
        Grammar.gbnf("root ::= " + '"a" ' * 100_000)
    capfd.readouterr()
    for broken, why in [
        ('root ::= "a" undefined', "Undefined rule identifier 'undefined'"),
        ('root ::= root "a"', "left recursion detected"),  # these two are llama.cpp's logged errors
        ('other ::= "a"', "grammar does not contain a 'root' symbol"),
        ("root ::= (", "expecting ')'"),
    ]:
        with pytest.raises(GrammarError, match="could not parse") as err:
            embedded_pipe.stream("x", max_tokens=4, grammar=Grammar.gbnf(broken))  # raises here, not at next
        assert err.value.param == "grammar" and why in err.value.message, err.value.message
    out = capfd.readouterr()
    assert "parse" not in out.err and "root ::=" not in out.err, "llama.cpp's complaint goes into the error"
    with pytest.raises(SettingsError, match="localspec.Grammar"):
        embedded_pipe.generate("x", max_tokens=4, grammar='root ::= "a"')


# ------------------------------------------------------------------------------------------ the rule
def _constraint(pipe, grammar: Grammar, text: str = "") -> Constraint:
    t = pipe.target
    c = Constraint(t.vocab, t.n_vocab, grammar, textless=t.textless_ids())
    for tok in t.tokenize(text, add_bos=False, special=False) if text else []:
        c.accept(tok)
    return c


def _allowed_one_by_one(c: Constraint) -> np.ndarray:
    return np.array([c.allows(t) for t in range(c.n_vocab)])


@pytest.mark.parametrize("state", ["", '{"name": "Al', '{"name": "Al", "age": 4'])
def test_best_and_the_mask_agree_with_checking_every_token_alone(embedded_pipe, state):
    c = _constraint(embedded_pipe, Grammar.json_schema(PERSON), state)
    allowed = _allowed_one_by_one(c)
    assert 0 < allowed.sum() < c.n_vocab
    assert not allowed[embedded_pipe.target.textless_ids()].any(), "control tokens never pass as text"
    rng = np.random.default_rng(0)
    for _ in range(20):
        row = rng.standard_normal(c.n_vocab).astype(np.float32) * 4
        masked = c.masked(row)
        assert (np.isfinite(masked) == allowed).all()
        assert c.best(row) == int(np.where(allowed, row, -np.inf).argmax())
    row[int(np.flatnonzero(allowed)[0])] = 100.0  # the unconstrained argmax is allowed: taken as is
    assert c.best(row) == int(np.flatnonzero(allowed)[0])


def test_a_json_string_takes_no_raw_control_character(embedded_pipe):
    """llama-cpp-python's converter lets a raw newline into a string (invalid JSON); localspec's does not."""
    vocab = embedded_pipe.target
    newline = [t for t in range(vocab.n_vocab) if vocab.piece(t) == b"\n"]
    quote = [t for t in range(vocab.n_vocab) if vocab.piece(t) == b'"']
    assert newline and quote
    in_string = _constraint(embedded_pipe, Grammar.json_schema(PERSON), '{"name": "Al')
    assert not in_string.allows(newline[0]) and in_string.allows(quote[0])
    assert _constraint(embedded_pipe, Grammar.json_object(), '{"a": "b').allows(newline[0]) is False


def test_end_of_generation_is_allowed_exactly_where_the_grammar_is_complete(embedded_pipe):
    eog = sorted(embedded_pipe.target.eog_ids)[0]
    assert not _constraint(embedded_pipe, Grammar.gbnf(WORDS), '["ab"').allows(eog)
    assert _constraint(embedded_pipe, Grammar.gbnf(WORDS), '["ab"]').allows(eog)


def test_the_reply_ends_where_nothing_but_whitespace_may_follow(embedded_pipe):
    """The tiny model prefers a blank to its end token: after a complete JSON value it wrote the
    whitespace the JSON rule allows after it, then spent max_tokens (a walkthrough's `run --json-schema`
    ended with "length"). The reply now ends at the value's last token: a prefix of the same text."""
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    for strategy in ("none", "ngram", "suffix"):
        r = embedded_pipe.generate(
            "def f():", max_tokens=48, grammar=Grammar.json_schema(schema), strategy=strategy
        )
        assert r.stats.finish_reason == "stop" and str(r).endswith("}"), (strategy, str(r))
        assert set(json.loads(str(r))) == {"x"}
    spaced = embedded_pipe.generate("x", max_tokens=20, grammar=Grammar.gbnf('root ::= "ab" " "*'))
    assert str(spaced) == "ab" and spaced.stats.finish_reason == "stop"
    number = embedded_pipe.generate("x", max_tokens=24, grammar=Grammar.json_schema({"type": "integer"}))
    assert str(number).isdigit()  # a digit may follow every digit: ends by the rule's bound or the model


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
        SamplingParams(temperature=1.0, min_p=0.05),
        SamplingParams(temperature=1.0, top_k=3),  # likely cuts every allowed token: the masked fallback
    ],
)
def test_the_constrained_distribution_is_the_requests_restricted_to_the_allowed_ones(embedded_pipe, params):
    c = _constraint(embedded_pipe, Grammar.gbnf(WORDS), '["a')
    allowed = _allowed_one_by_one(c)
    rng = np.random.default_rng(1)
    row = rng.standard_normal(c.n_vocab).astype(np.float32) * 3
    p = distribution(row, params)
    if (p * allowed).sum() > 0:
        want = p * allowed / (p * allowed).sum()
    else:
        want = distribution(np.where(allowed, row, -np.inf).astype(np.float32), params)
    np.testing.assert_allclose(c.distribution(row, params), want, atol=1e-12)
    draws = [c.sample(row, params, rng) for _ in range(3000)]
    assert all(allowed[d] for d in draws)
    support = np.flatnonzero(want > 0.01)
    freq = np.array([draws.count(int(t)) for t in support]) / len(draws)
    assert np.abs(freq - want[support]).max() < 0.04


def test_accepting_a_refused_token_is_an_error_not_an_abort(embedded_pipe):
    c = _constraint(embedded_pipe, Grammar.gbnf(WORDS))
    refused = next(t for t in range(c.n_vocab) if not c.allows(t))
    with pytest.raises(Exception, match="not allowed"):
        c.accept(refused)
    c.close()
    c.close()  # twice is harmless


# ------------------------------------------------------------------------------------------ generations
@pytest.mark.parametrize("strategy", ["none", "model", "ngram", "suffix"])
def test_every_strategy_gives_the_target_alone_s_constrained_output(embedded_pipe, strategy):
    grammar = Grammar.json_schema(PERSON)
    prompt = '{"name": "Ada", "age": 36}\n' * 2
    kw = dict(max_tokens=128, temperature=0, grammar=grammar)
    base, base_trace = traced(embedded_pipe, prompt, baseline=True, **kw)
    spec, spec_trace = traced(embedded_pipe, prompt, strategy=strategy, **kw)
    assert_lossless(base, base_trace, spec, spec_trace)  # token = the argmax among the allowed tokens
    assert base.stats.finish_reason == "stop", "the grammar ends the object, then only the end may follow"
    value = json.loads(str(base))
    assert set(value) == {"name", "age"} and isinstance(value["age"], int) and len(value["name"]) <= 12
    if strategy != "none":
        assert spec.stats.drafted > 0


def test_json_object_chat_and_streaming_agree(embedded_pipe):
    messages = [{"role": "user", "content": "Describe a cat as JSON."}]
    fmt = {"type": "json_object"}
    whole = embedded_pipe.chat(messages, response_format=fmt, max_tokens=60, temperature=0)
    stream = embedded_pipe.chat_stream(messages, response_format=fmt, max_tokens=60)
    streamed = "".join(r.text for r in stream)
    assert streamed == str(whole) and str(whole).startswith("{")
    if whole.stats.finish_reason == "stop":
        assert isinstance(json.loads(str(whole)), dict)
    with pytest.raises(GrammarError, match="cannot be given with"):
        embedded_pipe.chat(messages, response_format=fmt, grammar=Grammar.gbnf(WORDS), max_tokens=4)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "exact_support"),
    [
        ("ngram", 4096),  # a one-hot proposal
        ("model", 4096),  # a draft model's q, judged by min(1, p/q) (the tiny vocabulary is 2048 tokens)
        ("model", 0),  # the same, judged by the target's own draw (what a wide support of a big one gets)
    ],
)
def test_sampling_under_a_grammar_keeps_the_target_s_distribution(
    embedded_pipe, strategy, exact_support, monkeypatch
):
    monkeypatch.setattr("localspec.decoding.accept.EXACT_SUPPORT", exact_support)
    grammar = Grammar.gbnf(WORDS)
    prompt = '["cat", "dog"]\n' * 3
    kw = dict(max_tokens=4, temperature=0.5, grammar=grammar)
    n = 1200
    base = [tuple(embedded_pipe.generate(prompt, seed=s, baseline=True, **kw).tokens) for s in range(n)]
    spec, drafted = [], 0
    for s in range(n):
        r = embedded_pipe.generate(prompt, seed=s, strategy=strategy, n_max=3, p_min=0.0, **kw)
        spec.append(tuple(r.tokens))
        drafted += r.stats.drafted
    assert len(set(base)) > 20, "the distribution is too peaked for the test to mean anything"
    assert drafted > n, "the drafts must reach the rule under test"
    assert chi2_pvalue(base, spec) > 1e-3


# ------------------------------------------------------------------------------------------ tool calls
def _accepts(pipe, grammar: Grammar, text: str, *, trigger_id: int | None = None) -> bool:
    """Whether ``grammar`` lets the model write ``text`` (tokenized as the model would) and then end."""
    t = pipe.target
    c = Constraint(t.vocab, t.n_vocab, grammar, textless=t.textless_ids(), trigger_id=trigger_id)
    try:
        for tok in t.tokenize(text, add_bos=False, special=False):
            if not c.allows(tok):
                return False
            c.accept(tok)
        return c.allows(sorted(t.eog_ids)[0])
    finally:
        c.close()


def test_the_call_grammar_takes_well_formed_calls_of_declared_functions_only(embedded_pipe):
    from test_tool_calls import CALL, CLOCK, WEATHER

    from localspec.pipeline.tool_schema import call_grammar, check_tools

    tools = check_tools([WEATHER, CLOCK])
    many, one = call_grammar(tools), call_grammar(tools, parallel=False)
    time_call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert _accepts(embedded_pipe, many, CALL) and _accepts(embedded_pipe, many, time_call)
    assert _accepts(embedded_pipe, many, CALL + "\n" + time_call)
    assert _accepts(embedded_pipe, one, CALL) and not _accepts(embedded_pipe, one, CALL + "\n" + time_call)
    indented = CALL.replace('{"name"', '{\n  "name"').replace('"}}', '"\n  }\n}')
    assert _accepts(embedded_pipe, many, indented)
    for bad in (
        CALL.replace("get_weather", "launch"),  # not declared
        CALL.replace('"Paris"', "7"),  # city is a string
        CALL.replace('{"city": "Paris"}', "{}"),  # city is required
        CALL.replace("</tool_call>", ""),  # never closed
        "Sure! " + CALL,  # required: the reply is the calls
    ):
        assert not _accepts(embedded_pipe, many, bad), bad
    only_time = call_grammar(tools, only="get_time")
    assert _accepts(embedded_pipe, only_time, time_call) and not _accepts(embedded_pipe, only_time, CALL)


def test_each_function_keeps_its_own_definitions(embedded_pipe):
    from localspec.pipeline.tool_schema import call_grammar, check_tools

    def tool(name, item):
        params = {"type": "object", "properties": {"x": {"$ref": "#/$defs/Item"}}, "required": ["x"]}
        return {
            "type": "function",
            "function": {"name": name, "parameters": {**params, "$defs": {"Item": item}}},
        }

    grammar = call_grammar(check_tools([tool("a", {"type": "integer"}), tool("b", {"type": "boolean"})]))

    def call(name, x):
        return f'<tool_call>\n{{"name": "{name}", "arguments": {{"x": {x}}}}}\n</tool_call>'

    assert _accepts(embedded_pipe, grammar, call("a", "3")) and _accepts(
        embedded_pipe, grammar, call("b", "true")
    )
    assert not _accepts(embedded_pipe, grammar, call("a", "true"))
    assert not _accepts(embedded_pipe, grammar, call("b", "3"))


def test_a_lazy_grammar_leaves_the_text_free_until_its_trigger_token(embedded_pipe):
    t = embedded_pipe.target
    (brace,) = t.tokenize("{", add_bos=False, special=False)
    lazy = Grammar('root ::= "{" [a-z]+ "}"\n', trigger="{")
    assert _accepts(embedded_pipe, lazy, "Any text at all, 123.", trigger_id=brace)
    assert _accepts(embedded_pipe, lazy, "Text:\n{abc}", trigger_id=brace)
    assert not _accepts(embedded_pipe, lazy, "Text:\n{abc1}", trigger_id=brace)
    assert not _accepts(embedded_pipe, lazy, "Text:\n{abc", trigger_id=brace)
    # the trigger is the token: " {" is another token of this vocabulary, and leaves the text free
    assert _accepts(embedded_pipe, lazy, "Text, then {abc1}", trigger_id=brace)


def test_textless_ids_are_the_tokens_that_render_as_nothing(embedded_pipe):
    t = embedded_pipe.target
    want = [i for i in range(t.n_vocab) if i not in t.eog_ids and not t.piece(i)]
    assert list(t.textless_ids()) == want and want, "the embedded vocabulary has control tokens"


def test_interleaved_streams_with_their_own_grammars_each_give_what_they_give_alone(embedded_pipe):
    prompt = '{"name": "Ada", "age": 36}\n' * 2
    kw = dict(max_tokens=60, temperature=0, strategy="suffix")
    person, words = Grammar.json_schema(PERSON), Grammar.gbnf(WORDS)
    alone = [str(embedded_pipe.generate(prompt, grammar=g, **kw)) for g in (person, words)]
    a = embedded_pipe.stream(prompt, grammar=person, **kw)
    b = embedded_pipe.stream(prompt, grammar=words, **kw)
    got = ["", ""]
    live = [a, b]
    while any(live):  # one token of each in turn: the KV cache and the grammar states must not mix
        for i, s in enumerate(live):
            if s is not None:
                r = next(s, None)
                if r is None:
                    live[i] = None
                else:
                    got[i] += r.text
    assert got == alone


@pytest.mark.parametrize(
    ("schema", "kind"), [(None, "null"), ("x", "a string"), (3, "a number"), ([1], "an array")]
)
def test_a_schema_that_is_not_an_object_is_named_in_jsons_words(schema, kind):
    with pytest.raises(GrammarError, match=rf"must be an object .*got {kind}\n"):
        Grammar.json_schema(schema)
