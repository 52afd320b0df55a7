"""Tool calls in chat: the requests' ``tools`` checked, the model's calls read back out of its text.

localspec reads one tool-call format, the one the Qwen2.5/Qwen3 and Hermes chat templates teach their
models: each call is a JSON object ``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and
``</tool_call>``. A model speaks it when its chat template renders ``tools`` and names that tag
(:func:`template_format`); for any other template a request with tools is refused, never answered with
calls left in the text. The template renders the tools and the earlier turns (assistant ``tool_calls``,
``tool`` results) itself, so a prompt is what the model was trained on.

A call is written under a grammar (:func:`call_grammar`: the tag, one of the declared functions' names
and arguments matching that function's ``parameters`` schema, the closing tag): from the model's
``<tool_call>`` token on with ``tool_choice`` ``"auto"`` (the text before it is free), from the reply's
first token with ``"required"`` or a named function. So a call the model starts is always one the caller
can run, and everything is still the target's own choice among what the grammar allows
(:mod:`localspec.constrain.grammar`). ``"none"`` renders no tools. What a small model writes instead of the
tag (a whole reply that is one JSON call, bare or fenced) is read too; other text stays text.

Nothing here touches a model. :func:`tool_use` turns a request's tools into a :class:`ToolUse`, whose
:meth:`ToolUse.responses` gives a stream's tokens as a chat client shows them (:class:`ChatResponse`: what
``Pipeline.chat_stream`` yields and the server streams). The parts live next to this module, which keeps
exporting their names: :mod:`~localspec.pipeline.tool_schema` checks ``tools`` and ``tool_choice`` and builds
the calls' grammar, :mod:`~localspec.pipeline.tool_reader` reads the calls back out of a whole reply
(:func:`split_calls`) or a streamed one (:class:`CallSplitter`), and :mod:`~localspec.pipeline.chat_turns`
checks the messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from localspec.constrain.grammar import Grammar, reply_grammar
from localspec.decoding.engine import TokenResponse
from localspec.errors import GrammarError
from localspec.pipeline.tool_reader import CallSplitter, split_calls
from localspec.pipeline.tool_schema import (
    ToolCallError,
    call_grammar,
    check_choice,
    check_tools,
    template_format,
)


@dataclass(frozen=True)
class ToolUse:
    """What a chat request's tools mean for its prompt and its reply (:func:`tool_use` makes one)."""

    tools: list[dict[str, Any]] | None = None  # for the chat template; None: the model is not shown tools
    grammar: Grammar | None = None  # what a call must look like (lazy for "auto", see call_grammar)
    read_calls: bool = False  # whether calls are read out of the reply
    parallel: bool = True  # False: the first call only
    names: tuple[str, ...] = ()  # the declared functions

    def request_grammar(self, response_format: Any, given: Grammar | None) -> Grammar | None:
        """The grammar a chat request runs under: its ``response_format``'s, else the calls' (never both:
        response_format is refused where calls are read), else the ``given`` one; a :class:`GrammarError`
        when a grammar is given beside one of those."""
        grammar = reply_grammar(response_format, reads_calls=self.read_calls) or self.grammar
        if grammar is None:
            return given
        if given is not None:
            raise GrammarError(
                "a grammar cannot be given with response_format or tools (they bring their own)",
                param="grammar",
                hint="drop one",
            )
        return grammar

    def split(self, reply: str) -> tuple[str, list[dict[str, Any]]]:
        """(the reply's text outside the calls, the calls) for the model's ``reply`` (without the prefix);
        the reply as it is, and no calls, when calls are not read."""
        if not self.read_calls:
            return reply, []
        text, calls = split_calls(reply, self.names)
        return text, calls if self.parallel else calls[:1]

    def splitter(self) -> CallSplitter | None:
        """A :class:`CallSplitter` for a streamed reply; None when calls are not read (the text streams as
        it is)."""
        if not self.read_calls:
            return None
        return CallSplitter(self.names, parallel=self.parallel)

    def responses(self, stream: Iterable[TokenResponse]) -> Iterator[ChatResponse]:
        """``stream``'s tokens with their chat ``content`` and ``tool_calls`` entries (see
        :class:`ChatResponse`); the last token (the one with a ``finish_reason``) also carries what was
        held back until the reply ended."""
        splitter = self.splitter()
        for r in stream:
            content, calls = r.text, []
            if splitter is not None:
                content = splitter.feed(r.text)
                calls = splitter.take_deltas()  # a call's name, then its arguments as they come
                if r.finish_reason is not None:
                    rest, _ = splitter.finish()
                    content += rest
                    calls += splitter.take_deltas()  # what completes the calls: the rest, or calls read whole
            yield ChatResponse(**{f: getattr(r, f) for f in _TOKEN_FIELDS}, content=content, tool_calls=calls)


@dataclass
class ChatResponse(TokenResponse):
    """One token of a chat reply, with what a chat client shows of it (``Pipeline.chat_stream`` yields these).

    ``text`` is the token's text as the model wrote it. ``content`` is the part of the reply's text
    outside tool calls that can be shown now: with ``tools``, what may start a ``<tool_call>`` (and
    trailing whitespace) is held back until it is known, and a call's markup never shows; without tools it
    is ``text``. ``tool_calls`` holds OpenAI's streamed ``delta.tool_calls`` entries read at this token:
    a call's ``index``, ``id``, ``type`` and ``function.name`` as soon as its name is written, then pieces
    of its ``function.arguments`` (put them together by ``index``). A stream's contents add up to the
    text outside the calls that :meth:`ToolUse.split` reads from the whole reply, and its entries to the
    same calls (each reading draws its own ids).
    """

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


_TOKEN_FIELDS = tuple(f.name for f in fields(TokenResponse))


#: A plain chat: no tools shown, the reply's text as it is.
NO_TOOLS = ToolUse()


def tool_use(tools: Any, tool_choice: Any, template: str | None, *, parallel: bool = True) -> ToolUse:
    """The request's ``tools`` and ``tool_choice`` (OpenAI's shapes) checked against each other and against
    the model's chat ``template``; raises :class:`ToolCallError` naming the field. No tools (None or an
    empty list, which clients without tools send) or ``tool_choice="none"``: a plain chat."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise ToolCallError("tool_choice needs tools", param="tool_choice")
        return NO_TOOLS
    checked = check_tools(tools)
    choice = check_choice(tool_choice, checked)
    if choice == "none":
        return NO_TOOLS  # the model is not told of the tools, so it answers in text
    if template_format(template) is None:
        raise ToolCallError(
            "tools: this model's chat template has no tool-call format localspec reads (it reads the "
            "<tool_call> JSON of Qwen2.5, Qwen3 and Hermes models)",
            param="tools",
            hint="send the request without tools, or use such a model",
            unsupported=True,
        )
    names = tuple(t["function"]["name"] for t in checked)
    only = choice.removeprefix("function:") if choice and choice.startswith("function:") else None
    grammar = call_grammar(checked, only=only, parallel=parallel, lazy=choice == "auto")
    return ToolUse(checked, grammar, True, parallel, names)
