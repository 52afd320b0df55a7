"""A target's own chat template, rendered to prompt tokens (the template's text alone as control tokens)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localspec.llama.chat_tokens import ChatTokenizer, chat_segments

if TYPE_CHECKING:
    from localspec.llama.runtime import Model


class ChatFormat:
    """The chat template of ``target`` (its ``tokenizer.chat_template``) with its BOS and EOS texts."""

    def __init__(self, target: Model, template: str) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        llama = target.llama
        self.bos = llama._model.token_get_text(llama.token_bos()) if llama.token_bos() >= 0 else ""
        eos = llama._model.token_get_text(llama.token_eos()) if llama.token_eos() >= 0 else ""
        self.tokenizer = ChatTokenizer(
            target.vocab, lambda s: target.tokenize(s, add_bos=False, special=False)
        )
        self.formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=self.bos)

    def tokens(
        self, messages: list[dict], tools: list[dict] | None, reply_prefix: str
    ) -> tuple[list[int], list[str]]:
        """``messages`` (and ``tools``) rendered: (prompt tokens, stop strings); see
        :meth:`localspec.pipeline.pipeline.Pipeline.format_chat`."""
        formatter, bos, chat_tok = self.formatter, self.bos, self.tokenizer
        payload = {"messages": messages, "tools": tools or None}
        # The template's own text only becomes control tokens: "<|im_start|>" typed in a message (or a tool's
        # description) stays text.
        render = lambda p: formatter(messages=p["messages"], tools=p["tools"]).prompt  # noqa: E731
        prompt = render(payload)
        segments = chat_segments(prompt, render, payload, chat_tok.control_texts)
        if reply_prefix:
            segments = [*segments, (reply_prefix, False)]
        add_bos = not (bos and prompt.startswith(bos))
        tokens = chat_tok.tokenize(segments, add_special=add_bos)
        return tokens, [formatter.eos_token] if formatter.eos_token else []
