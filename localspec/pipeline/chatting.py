"""A pipeline's chat calls: a conversation rendered with the target's own chat template, the reply streamed or
whole, with tool calls and JSON replies read out (:class:`Chatting`, a part of
:class:`~localspec.pipeline.pipeline.Pipeline`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from localspec.decoding.engine import TokenResponse
from localspec.errors import LocalspecError
from localspec.gguf.pairing import PairInfo
from localspec.llama.runtime import Model
from localspec.pipeline.chat_format import ChatFormat
from localspec.pipeline.chat_turns import chat_messages
from localspec.pipeline.results import GenerationResult, collect
from localspec.pipeline.tool_calls import ChatResponse, ToolUse, tool_use


class Chatting:
    """The chat calls of a pipeline (mixed into :class:`~localspec.pipeline.pipeline.Pipeline`, which
    provides what is declared here)."""

    info: PairInfo
    _target: Model
    _chat: ChatFormat | None
    stream_tokens: Callable[..., Iterator[TokenResponse]]

    def chat_stream(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        tool_choice: Any = None,
        response_format: Any = None,
        **kwargs,
    ) -> Iterator[ChatResponse]:
        """Stream a reply to ``messages`` formatted with the model's own chat template, one
        :class:`ChatResponse` per token: ``.text`` as the model wrote it, ``.content`` and ``.tool_calls``
        as a chat client shows them (the calls' markup read out, their names and arguments streamed as
        they are written). ``tools``, ``tool_choice`` and ``response_format`` as in OpenAI's API (see
        :func:`localspec.pipeline.tool_calls.tool_use` and
        :func:`localspec.constrain.grammar.response_format_grammar`)."""
        stream, use = self._chat_reply(messages, tools, tool_choice, response_format, kwargs)
        return use.responses(stream)

    def chat(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        tool_choice: Any = None,
        response_format: Any = None,
        **kwargs,
    ) -> GenerationResult:
        """A whole reply to ``messages``, formatted with the model's own chat template.

        Args:
            messages: the conversation, in OpenAI's shape (``role``, ``content``; earlier tool calls and
                their results too).
            tools: functions the model may call, in OpenAI's shape.
            tool_choice: as in OpenAI's API: ``"auto"``, ``"none"``, ``"required"`` or one function.
            response_format: ``{"type": "json_object"}`` (or ``json_schema``) makes the reply that JSON.
            **kwargs: :meth:`stream_tokens`'s keyword arguments (``max_tokens``, ``temperature``, ...).

        Returns:
            The reply as the model wrote it, a :class:`GenerationResult`; with ``tools``,
            ``result.tool_calls`` holds the calls it made (OpenAI's shape: ``id``, ``type``,
            ``function.name``, ``function.arguments`` as a JSON string) and ``result.content`` the text
            outside them.

        Raises:
            LocalspecError: the target has no chat template.
            MessageError: ``messages`` that are not a list of chat turns.
            ToolCallError: malformed ``tools`` or ``tool_choice``.
            GrammarError: a ``grammar`` given with ``response_format`` or ``tools``, or a
                ``response_format`` that cannot be followed.
            SettingsError: arguments out of range, as :meth:`stream_tokens`.
            ContextOverflowError: the formatted prompt and ``max_tokens`` do not fit the context.
        """
        stream, use = self._chat_reply(messages, tools, tool_choice, response_format, kwargs)
        result = collect(stream)
        result.content, result.tool_calls = use.split(result.text)
        return result

    def _chat_reply(
        self, messages: list[dict], tools: Any, tool_choice: Any, response_format: Any, kwargs: dict
    ) -> tuple[Iterator[TokenResponse], ToolUse]:
        use = tool_use(tools, tool_choice, self.chat_template)
        kwargs["grammar"] = use.request_grammar(response_format, kwargs.get("grammar"))
        messages = chat_messages(messages)  # checked; earlier calls' arguments as objects, as templates want
        tokens, stops = self.format_chat(messages, tools=use.tools)
        kwargs["stop"] = list(kwargs.get("stop") or []) + stops
        return self.stream_tokens(tokens, **kwargs), use

    def format_chat(
        self, messages: list[dict], *, tools: list[dict] | None = None, reply_prefix: str = ""
    ) -> tuple[list[int], list[str]]:
        """``messages`` rendered with the target's own chat template: (prompt tokens, stop strings).

        ``tools`` (OpenAI's shape, checked by :func:`localspec.pipeline.tool_calls.check_tools`) are
        rendered by the template too; ``reply_prefix`` is the start of the assistant's reply, written
        after the template's generation prompt as the caller's text (what ``tool_choice`` forces, see
        :func:`localspec.pipeline.tool_calls.reply_prefix`)."""
        template = self.chat_template
        if not template:
            raise LocalspecError(
                f"{self.info.target_path.name} has no chat template in its metadata",
                hint="use generate()/stream() with a plain prompt instead of chat()",
            )
        if self._chat is None:
            self._chat = ChatFormat(self._target, template)
        return self._chat.tokens(messages, tools, reply_prefix)

    @property
    def chat_template(self) -> str | None:
        """The target's chat template (``tokenizer.chat_template`` in its GGUF), or None."""
        return self._target.metadata.get("tokenizer.chat_template") or None
