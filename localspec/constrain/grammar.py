"""Constrained output: every emitted token keeps a GBNF grammar (llama.cpp's) satisfiable.

What "the target's own output" means under a grammar, so that the target alone and every speculative
path give the same thing (the lossless law, with the grammar as part of the request):

- greedy: the highest-scoring token the grammar allows. The unconstrained argmax is checked first (one
  candidate, microseconds) and the whole vocabulary masked only when the grammar refuses it, since a mask
  costs 15-55 ms for a 152K vocabulary (measured with Qwen2.5's on a 2-core Xeon, about half a target
  token of a 1.5B model);
- sampling: the request's distribution (temperature, top-k, top-p, min-p, :func:`localspec.llama.sampling.
  distribution`) restricted to the tokens the grammar allows and renormalized; where it puts no mass on
  any of them (top-k or top-p cut every allowed token away), the same settings applied to the masked
  logits. A draw is rejection sampling against the grammar (exact: the kept draw has the restricted
  distribution), falling back to the full mask after :data:`REJECTION_TRIES` refused draws.

A drafted token is verified against exactly that rule, so a draft the grammar refuses is simply not
accepted. Tokens that render as no text (control tokens other than end-of-generation) are never allowed:
the grammar judges a token by its text, and ``<|im_start|>`` inside a JSON string would otherwise pass as
the characters it spells.

A grammar comes from GBNF text (:meth:`Grammar.gbnf`, the Python API only: a hostile grammar can exhaust
llama.cpp's parser), the built-in JSON object grammar (:meth:`Grammar.json_object`), or a JSON schema
(:meth:`Grammar.json_schema`, through llama-cpp-python's converter, with every count and the nesting
bounded first). OpenAI's ``response_format`` maps onto them in :func:`response_format_grammar`.
"""

from __future__ import annotations

import ctypes
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import llama_cpp
import numpy as np
from llama_cpp.llama_grammar import JSON_GBNF, RESERVED_NAMES, SchemaConverter

from localspec.constrain.number_ranges import Bound, integer_range_gbnf, number_range, number_range_gbnf
from localspec.errors import GrammarError, LocalspecError
from localspec.llama.logs import llama_said
from localspec.llama.sampling import SamplingParams, distribution, sample

#: Refused draws before a sampled token is drawn from the fully masked distribution instead.
REJECTION_TRIES = 8
#: Bounds on what a request may ask for (a grammar is parsed per request; a schema is converted per request).
MAX_GRAMMAR_CHARS = 256 * 1024
MAX_SCHEMA_CHARS = 64 * 1024
MAX_SCHEMA_DEPTH = 32
#: The largest count a schema may name (minItems, maxLength, a pattern's {m,n}...): the converter writes
#: out that many copies of a rule, and llama.cpp refuses repetitions above 2000 anyway.
MAX_SCHEMA_COUNT = 2000
_COUNT_KEYS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")
_PATTERN_COUNT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
#: JSON strings hold no raw control characters; llama-cpp-python's converter lets them through (its rule
#: below), llama.cpp's own converter does not. The converter's rule is swapped for llama.cpp's.
_LOOSE_CHAR = r'char ::= [^"\\] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
#: Between JSON tokens llama-cpp-python's converter allows one space at most, so a model that writes its
#: JSON indented (most do) is refused at every line break and pays a full mask there; llama.cpp's own
#: converter allows what such JSON has (a line break or two, then an indent).
_TIGHT_SPACE = 'space ::= " "?'
_JSON_SPACE = r'space ::= | " " | "\n"{1,2} [ \t]{0,20}'
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar and its start rule; ``what`` names it in errors (``response_format``...).

    With a ``trigger`` the grammar is lazy: the text is free until the model writes the token that spells
    ``trigger`` (one token of the vocabulary, such as Qwen's ``<tool_call>``), and follows the grammar from
    that token on (the grammar's root starts with it). Where no single token spells it, nothing is
    constrained."""

    text: str
    root: str = "root"
    what: str = "grammar"
    trigger: str = ""

    @classmethod
    def gbnf(cls, text: str, *, root: str = "root", what: str = "grammar") -> Grammar:
        """Your own GBNF (llama.cpp's grammar format), checked when a generation first uses it; ``what``
        names it in errors (a file's path, say)."""
        if not isinstance(text, str) or not text.strip():
            raise GrammarError(f"the {what} is empty", param=what, hint="give GBNF text with a root")
        if len(text) > MAX_GRAMMAR_CHARS:
            raise GrammarError(
                f"the {what} is {len(text):,} characters, more than {MAX_GRAMMAR_CHARS:,}",
                param=what,
                hint="write repeated parts as rules with * or {m,n}",
            )
        return cls(text, root, what)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's ``{"type": "json_object"}``)."""
        return cls(JSON_GBNF, "root", "response_format")

    @classmethod
    def json_schema(
        cls,
        schema: Any,
        *,
        what: str = "response_format.json_schema.schema",
        max_chars: int = MAX_SCHEMA_CHARS,
    ) -> Grammar:
        """JSON matching ``schema`` (a JSON schema as a dict), converted by llama-cpp-python."""
        if not isinstance(schema, Mapping):
            raise GrammarError(
                f"the JSON schema must be an object ({{...}}), got {_json_kind(schema)}",
                param=what,
                hint='e.g. {"type": "object", "properties": {"name": {"type": "string"}}}',
            )
        try:
            text = json.dumps(schema)
        except (TypeError, ValueError, RecursionError):
            raise GrammarError("the JSON schema is not plain JSON", param=what) from None
        if len(text) > max_chars:
            raise GrammarError(
                f"the JSON schema is {len(text):,} characters, more than {max_chars:,}",
                param=what,
                hint="use $defs and $ref for repeated parts",
            )
        check_schema(schema, what)
        try:
            gbnf = _schema_to_gbnf(text)
        except RecursionError:
            raise GrammarError("the JSON schema nests too deeply to convert", param=what) from None
        except Exception as exc:  # the converter raises what it happens to (KeyError, AssertionError...)
            why, hint = _converter_problem(exc)
            raise GrammarError(
                f"this JSON schema cannot be turned into a grammar: {why}", param=what, hint=hint
            ) from None
        swap = {_LOOSE_CHAR: _JSON_CHAR, _TIGHT_SPACE: _JSON_SPACE}
        lines = [swap.get(line, line) for line in gbnf.splitlines()]
        return cls("\n".join(lines) + "\n", "root", what)


_JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
#: keywords whose values are JSON values, not schemas (a "type" key inside them is data)
_VALUE_KEYS = frozenset({"default", "examples", "const", "enum"})


#: Bounds that contradict each other when the first is above the second (nothing can match them; the
#: converter writes a grammar that drops or garbles one, and the output breaks the schema).
_BOUND_PAIRS = (
    ("minimum", "maximum"),
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
)


_REF_ERROR = re.compile(r"Error resolving ref stdin(#\S*?):")
_UNRECOGNIZED = "Unrecognized schema: "


def _converter_problem(exc: Exception) -> tuple[str, str]:
    """What llama-cpp-python's converter's exception means, in the schema's words, and the next step
    (its own text, an ``AssertionError`` naming "stdin", is no help to the one who wrote the schema)."""
    text = str(exc)
    if m := _REF_ERROR.search(text):
        return (
            f"its $ref {m.group(1)!r} points at nothing in the schema",
            "define it under $defs, or write it inline",
        )
    if text.startswith(_UNRECOGNIZED):
        part = text[len(_UNRECOGNIZED) :]
        return (
            f"this part is nothing a grammar can hold: {part[:200]}",
            "drop it (keywords such as not have no grammar), or write out the values it allows",
        )
    return (
        f"{type(exc).__name__}: {text[:300]}",
        "remote $ref and some keywords are not supported; see llama.cpp's grammars/README.md for what is",
    )


def _json_kind(value: Any) -> str:
    """What a decoded JSON value is, in JSON's words (not Python's "NoneType")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _is_number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: Keys of a schema whose value maps names to schemas (their keys are names, not keywords).
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})
#: Keywords llama-cpp-python's converter drops without a word, so the output would not hold to them:
#: refused, with what the keyword asks for.
_UNENFORCED = {
    "multipleOf": "a multiple",
    "uniqueItems": "unique items",
    "minProperties": "a number of properties",
    "maxProperties": "a number of properties",
    "contains": "an item matching a schema",
    "minContains": "a number of matching items",
    "maxContains": "a number of matching items",
    "if": "a condition",
    "patternProperties": "property names by pattern",
    "propertyNames": "property names by schema",
    "dependentRequired": "properties that require others",
    "dependentSchemas": "properties that require schemas",
    "unevaluatedProperties": "no unevaluated properties",
    "unevaluatedItems": "no unevaluated items",
}
_NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def check_schema(schema: Any, what: str) -> None:
    """Refuse what would make the converter or llama.cpp's parser spend without bound, what no value can
    match, and what the converter would silently not enforce (so the output would break the schema)."""
    stack: list[tuple[Any, int, bool]] = [(schema, 1, True)]  # (node, depth, node is a schema)
    while stack:
        node, depth, is_schema = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarError(
                f"the JSON schema nests more than {MAX_SCHEMA_DEPTH} levels deep",
                param=what,
                hint="flatten it, or name the inner parts in $defs",
            )
        if isinstance(node, Mapping):
            if is_schema:
                _check_shapes(node, what)
                _check_schema_node(node, what)
            stack.extend(
                (v, depth + 1, not (is_schema and k in _SCHEMA_MAPS))  # a map's values are schemas
                for k, v in node.items()
                if not (is_schema and k in _VALUE_KEYS)
            )
        elif isinstance(node, list):
            stack.extend((v, depth + 1, True) for v in node)


#: What the value of each keyword must be (a value of another kind makes no schema: the converter crashed on
#: some, and read others as something else, e.g. ``"required": "name"`` as the properties n, a, m and e).
_SHAPES: dict[str, tuple[tuple[type, ...], str, str]] = {
    "required": ((list,), "an array of property names", '"required": ["name"]'),
    "properties": ((Mapping,), "an object of property schemas", '"properties": {"name": {"type": "string"}}'),
    "$defs": ((Mapping,), "an object of schemas", '"$defs": {"item": {"type": "string"}}'),
    "definitions": ((Mapping,), "an object of schemas", '"definitions": {"item": {"type": "string"}}'),
    "items": ((Mapping, bool, list), "a schema", '"items": {"type": "string"}'),
    "prefixItems": ((list,), "an array of schemas", '"prefixItems": [{"type": "string"}]'),
    "additionalProperties": ((Mapping, bool), "a schema or true/false", '"additionalProperties": false'),
    "anyOf": ((list,), "an array of schemas", '"anyOf": [{"type": "string"}, {"type": "null"}]'),
    "oneOf": ((list,), "an array of schemas", '"oneOf": [{"type": "string"}, {"type": "null"}]'),
    "allOf": ((list,), "an array of schemas", '"allOf": [{"$ref": "#/$defs/base"}]'),
    "enum": ((list,), "an array of values", '"enum": ["red", "green"]'),
    "pattern": ((str,), "a regular expression", '"pattern": "^[a-z]+$"'),
    "type": ((str, list), "a type name or an array of them", '"type": "string"'),
}


def _check_shapes(node: Mapping, what: str) -> None:
    """Refuse a keyword whose value is of the wrong kind (:data:`_SHAPES`), naming the keyword."""
    for key, (kinds, shape, example) in _SHAPES.items():
        if key not in node:
            continue
        value = node[key]
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if ok and key in ("required", "type") and isinstance(value, list):
            ok = all(isinstance(v, str) for v in value)
        if not ok:
            said = json.dumps(value, default=str)[:80]
            raise GrammarError(
                f"the JSON schema's {key} is {_json_kind(value)} ({said}), not {shape}",
                param=what,
                hint=f"e.g. {example}",
            )


def _check_pattern(pattern: str, what: str) -> None:
    """Refuse a pattern that is not a regular expression, or not one the grammar can hold whole."""
    for m in _PATTERN_COUNT.finditer(pattern):
        if any(g and int(g) > MAX_SCHEMA_COUNT for g in m.groups()):
            raise GrammarError(
                f"the pattern's repeat {m.group(0)} is more than a grammar can spell out",
                param=what,
                hint=f"use counts of {MAX_SCHEMA_COUNT} or less",
            )
    if not (pattern.startswith("^") and pattern.endswith("$")):
        raise GrammarError(
            f"the JSON schema's pattern {pattern[:80]!r} is not anchored: a grammar holds a pattern of the "
            "whole string only",
            param=what,
            hint="start it with ^ and end it with $ (for a match anywhere: ^.*(...).*$)",
        )
    try:
        re.compile(pattern)
    except re.error as exc:  # the converter read "^($" as the empty string, and the reply broke the schema
        raise GrammarError(
            f"the JSON schema's pattern {pattern[:80]!r} is not a regular expression a grammar can hold: "
            f"{exc}",
            param=what,
            hint="fix the pattern: brackets and parentheses must close (\\p{...} classes are not supported)",
        ) from None


def _check_schema_node(node: Mapping, what: str) -> None:
    """The checks of :func:`check_schema` on one schema (not a name -> schema map)."""
    for key in _COUNT_KEYS:
        n = node.get(key)
        if _is_number(n) and n > MAX_SCHEMA_COUNT:
            raise GrammarError(
                f"{key} {n} is more than a grammar can spell out ({MAX_SCHEMA_COUNT} at most)",
                param=what,
                hint=f"drop {key}, or use {MAX_SCHEMA_COUNT} or less",
            )
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        _check_pattern(pattern, what)
    for low, high in _BOUND_PAIRS:
        lo, hi = node.get(low), node.get(high)
        if _is_number(lo) and _is_number(hi) and lo > hi:
            raise GrammarError(
                f"the JSON schema's {low} {lo} is more than its {high} {hi}: no value can match",
                param=what,
                hint=f"fix the bounds so that {low} <= {high}",
            )
    bounds = [k for k in _NUMBER_BOUNDS if k in node]
    for key in bounds:
        v = node[key]
        if not _is_number(v) or not math.isfinite(v):
            raise GrammarError(
                f"the JSON schema's {key} is {v!r}, not a number a bound can be", param=what, hint="drop it"
            )
    if bounds and node.get("type") not in ("integer", "number"):
        raise GrammarError(
            f"the JSON schema's {bounds[0]} is on a {node.get('type') or 'value without a type'}: only "
            "the bounds of one integer or number type can be held by a grammar here",
            param=what,
            hint='give it "type": "integer" or "number", or drop the bound (and check the value yourself)',
        )
    if bounds and node["type"] == "integer" and _integer_bounds(node) is None:
        raise GrammarError(
            "the JSON schema's bounds leave no integer to match", param=what, hint="widen them"
        )
    if bounds and node["type"] == "number" and not number_range(*_number_bounds(node)):
        raise GrammarError("the JSON schema's bounds leave no number to match", param=what, hint="widen them")
    for key in ("enum", "anyOf", "oneOf"):
        if isinstance(node.get(key), list) and not node[key]:
            raise GrammarError(
                f"the JSON schema's {key} is empty: no value can match",
                param=what,
                hint=f"list at least one {'value' if key == 'enum' else 'schema'}",
            )
    for key, asks in _UNENFORCED.items():
        if key in node and not (key == "uniqueItems" and node[key] is False):
            raise GrammarError(
                f"the JSON schema's {key} ({asks}) cannot be held by a grammar here: the output would "
                "not follow it",
                param=what,
                hint=f"drop {key} (and check it in your code)",
            )
    parts = node.get("allOf")
    if isinstance(parts, list) and not all(
        isinstance(p, Mapping) and set(p) <= _ALLOF_PART_KEYS and p.get("type", "object") == "object"
        for p in parts
    ):
        raise GrammarError(
            "the JSON schema's allOf is held only as object parts merged (properties, required, $ref)",
            param=what,
            hint="write the schema out as one object, or as anyOf",
        )
    kind = node.get("type")
    for t in kind if isinstance(kind, list) else [kind]:
        if isinstance(t, str) and t not in _JSON_TYPES:  # the converter says "AssertionError"
            raise GrammarError(
                f"the JSON schema has type {t!r}, which is not a JSON schema type",
                param=what,
                hint=f"use one of {', '.join(sorted(_JSON_TYPES))}",
            )


def _integer_bounds(node: Mapping) -> tuple[int | None, int | None] | None:
    """The integers a schema's bounds allow, as (lowest, highest), None for no bound; None when none is
    allowed. JSON Schema's bounds may be fractional (``minimum: 1.5`` allows 2 and up)."""
    lows = [math.ceil(node["minimum"])] if "minimum" in node else []
    highs = [math.floor(node["maximum"])] if "maximum" in node else []
    if "exclusiveMinimum" in node:
        lows.append(math.floor(node["exclusiveMinimum"]) + 1)
    if "exclusiveMaximum" in node:
        highs.append(math.ceil(node["exclusiveMaximum"]) - 1)
    lo, hi = max(lows, default=None), min(highs, default=None)
    if lo is not None and hi is not None and lo > hi:
        return None
    return lo, hi


def _number_bounds(node: Mapping) -> tuple[Bound | None, Bound | None]:
    """A schema's lower and upper bound (the tighter one where both forms are given; None: none)."""
    lows = [Bound(node[k], k == "minimum") for k in ("minimum", "exclusiveMinimum") if k in node]
    highs = [Bound(node[k], k == "maximum") for k in ("maximum", "exclusiveMaximum") if k in node]
    lo = max(lows, key=lambda b: (b.value, not b.inclusive), default=None)
    hi = min(highs, key=lambda b: (b.value, b.inclusive), default=None)
    return lo, hi


class _BoundedConverter(SchemaConverter):
    """llama-cpp-python's converter, with the bounds of integers and numbers (minimum, maximum and their
    exclusive forms) held by the grammar; the converter leaves them out ("TODO: support minimum...")."""

    def visit(self, schema: Any, name: str) -> str:
        if (
            isinstance(schema, dict)
            and schema.get("type") in ("integer", "number")
            and any(k in schema for k in _NUMBER_BOUNDS)
            and not any(k in schema for k in ("$ref", "anyOf", "oneOf", "const", "enum"))
        ):
            rule = name + "-" if name in RESERVED_NAMES else name or "root"
            if schema["type"] == "integer":
                bounds = _integer_bounds(schema)
                assert bounds is not None, "check_schema refuses bounds that allow no integer"
                return self._add_rule(rule, integer_range_gbnf(*bounds) + " space")
            return self._add_rule(rule, number_range_gbnf(*_number_bounds(schema)) + " space")
        return super().visit(schema, name)


def _schema_to_gbnf(text: str) -> str:
    """What llama-cpp-python's ``json_schema_to_gbnf`` does, with :class:`_BoundedConverter`."""
    converter = _BoundedConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    schema = converter.resolve_refs(json.loads(text), "stdin")
    converter.visit(schema, "")
    return converter.format_grammar()


#: What an allOf part may hold for the converter to merge it faithfully.
_ALLOF_PART_KEYS = frozenset({"type", "properties", "required", "$ref", "anyOf", "title", "description"})


def response_format_grammar(response_format: Any) -> Grammar | None:
    """OpenAI's ``response_format``: None or ``{"type": "text"}`` -> no grammar; ``json_object`` -> any
    JSON object; ``json_schema`` -> ``{"json_schema": {"name": ..., "schema": {...}}}`` as a grammar."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise GrammarError(
            "response_format must be an object", param="response_format", hint='e.g. {"type": "json_object"}'
        )
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise GrammarError(
                "response_format.json_schema must be an object with a schema",
                param="response_format.json_schema",
                hint='e.g. {"name": "person", "schema": {"type": "object", ...}}',
            )
        return Grammar.json_schema(spec["schema"])
    raise GrammarError(
        f"response_format type {kind!r} is not one of text, json_object, json_schema",
        param="response_format.type",
        hint='use {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}',
    )


def reply_grammar(response_format: Any, *, reads_calls: bool) -> Grammar | None:
    """A chat reply's grammar from its ``response_format``; refused next to tools the reply may call
    (``reads_calls``): a JSON format would rule the calls out."""
    grammar = response_format_grammar(response_format)
    if grammar is not None and reads_calls:
        raise GrammarError(
            "response_format and tools cannot be used together: the format would rule out the calls",
            param="response_format",
            hint='leave response_format out with tools, or send tool_choice "none"',
        )
    return grammar


class Constraint:
    """One generation's grammar state over a vocabulary: what may come next, and taking a token.

    ``textless`` are the ids that render as no text (never allowed, see the module docstring); an end of
    generation is allowed where the grammar is complete; ``trigger_id`` is the token that starts a lazy
    grammar (:attr:`Grammar.trigger`). Not thread-safe: a generation's rounds run one at a time under the
    engine's lock. :meth:`close` frees llama.cpp's state (also when collected).
    """

    def __init__(
        self,
        vocab: Any,
        n_vocab: int,
        grammar: Grammar,
        *,
        textless: np.ndarray,
        trigger_id: int | None = None,
    ) -> None:
        self._sampler: Any = None
        self.grammar = grammar
        self.n_vocab = n_vocab
        self._blocked = np.zeros(n_vocab, dtype=bool)
        self._blocked[textless] = True
        text, root = grammar.text.encode("utf-8"), grammar.root.encode("utf-8")
        if grammar.trigger and trigger_id is None:
            raise ValueError("a lazy grammar needs the id of its trigger token")
        with llama_said() as said:  # why a grammar fails (and the whole grammar)
            if grammar.trigger and trigger_id is not None:
                ids = (llama_cpp.llama_token * 1)(trigger_id)
                self._sampler = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                    vocab, text, root, None, 0, ids, 1
                )
            else:
                self._sampler = llama_cpp.llama_sampler_init_grammar(vocab, text, root)
        if not self._sampler:
            # a parse error is printed to fd 2 (those lines come first), the rest is logged as an error
            errors = [line for line in said.lines if "error" in line] + said.errors
            why = errors[0] if errors else ""
            raise GrammarError(
                f"llama.cpp could not parse the {grammar.what}" + (f": {why.strip()[:300]}" if why else ""),
                param=grammar.what,
                hint="a JSON schema's large counts (maxLength, maxItems) are spelled out rule by rule and "
                "llama.cpp refuses more than 2000: lower them"
                if "schema" in grammar.what
                else "see llama.cpp's grammars/README.md for the GBNF format (a root rule, then rules)",
            )
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._one_arr = _token_array(self._one)
        self._scratch = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._ids = np.arange(n_vocab, dtype=np.int32)

    def close(self) -> None:
        if self._sampler:
            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None

    __del__ = close

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next."""
        if self._blocked[token]:
            return False
        self._one[0] = (token, 0.0, 0.0)
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(self._one_arr))
        return bool(np.isfinite(self._one[0]["logit"]))

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` (one row) with every token the grammar refuses at -inf (the whole vocabulary)."""
        out = self._apply(self._ids, logits)
        if not np.isfinite(out).any():
            raise LocalspecError(
                f"the {self.grammar.what} allows no token of this model's vocabulary here",
                hint="check that the grammar can be written with this model's tokens",
            )
        return out

    def _apply(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Logits of ``ids`` (in that order) after the grammar: refused ones at -inf."""
        buf = self._scratch[: len(ids)]
        buf["id"] = ids
        buf["logit"] = logits[ids]
        arr = _token_array(buf)
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(arr))
        out = buf["logit"].copy()
        out[self._blocked[ids]] = -np.inf
        return out

    def best(self, logits: np.ndarray) -> int:
        """Greedy: the highest-scoring token the grammar allows."""
        token = int(logits.argmax())
        if self.allows(token):
            return token
        return int(self.masked(logits).argmax())

    def distribution(
        self,
        logits: np.ndarray,
        params: SamplingParams,
        *,
        max_support: int | None = None,
        unconstrained: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """The request's distribution restricted to what the grammar allows (see the module docstring);
        None when more than ``max_support`` tokens have a probability (checking them all would cost up to
        a full mask: the caller draws with :meth:`sample` instead). ``unconstrained``: the request's
        distribution of ``logits``, when the caller has it already."""
        p = distribution(logits, params) if unconstrained is None else unconstrained
        support = np.flatnonzero(p)
        if max_support is not None and len(support) > max_support:
            return None
        kept = np.isfinite(self._apply(support, logits))
        if kept.any():
            out = np.zeros_like(p)
            out[support[kept]] = p[support[kept]]
            return out / out.sum()
        return distribution(self.masked(logits), params)

    def sample(
        self,
        logits: np.ndarray,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        unconstrained: np.ndarray | None = None,
    ) -> int:
        """One draw from :meth:`distribution`, by rejection (cheap when the model already follows the
        grammar), exact either way."""
        p = distribution(logits, params) if unconstrained is None else unconstrained
        for _ in range(REJECTION_TRIES):
            token = sample(p, rng)
            if self.allows(token):
                return token
        exact = self.distribution(logits, params, unconstrained=p)
        assert exact is not None  # no max_support: always computed
        return sample(exact, rng)

    def accept(self, token: int) -> None:
        """Take ``token`` (which :meth:`allows`): the grammar moves on past it."""
        if not self.allows(token):  # llama.cpp aborts the process on a token its grammar refuses
            raise LocalspecError(
                f"token {token} is not allowed by the {self.grammar.what} here (a bug in localspec)",
                hint="report it with the request that caused it",
            )
        llama_cpp.llama_sampler_accept(self._sampler, token)

    def complete(self, ends: frozenset[int], space: Callable[[], np.ndarray]) -> bool:
        """Whether the text so far is complete and nothing but whitespace may follow it: an end of
        generation (one of ``ends``) is allowed, and every other token allowed is in ``space()`` (the
        vocabulary's whitespace-only ids, asked for only then). JSON grammars allow a little whitespace
        after the top-level value (llama.cpp's ``space`` rule: up to two newlines and 20 blanks); a model
        that prefers a blank to its end token then wrote it up to that bound, or a token budget
        (``max_tokens``) on a small model, before it ended. The check costs microseconds where the end is
        not allowed (inside the value); where it is, one mask of the whole vocabulary (15-55 ms at 152K
        tokens: once at the end of an object, at each digit of a top-level number). Never for a lazy
        grammar: before its trigger everything is allowed, and the end with it."""
        if self.grammar.trigger or not any(self.allows(t) for t in ends):
            return False
        allowed = np.flatnonzero(np.isfinite(self._apply(self._ids, np.zeros(self.n_vocab, np.float32))))
        others = np.setdiff1d(allowed, np.fromiter(ends, dtype=np.int64, count=len(ends)))
        return bool(np.isin(others, space()).all())


def _token_array(buf: np.ndarray) -> Any:
    return llama_cpp.llama_token_data_array(
        data=buf.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(buf), selected=-1, sorted=False
    )
