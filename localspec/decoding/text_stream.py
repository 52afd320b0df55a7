"""A generation's text as it streams: token bytes to text, partial UTF-8 and stop strings held back."""

from __future__ import annotations

import codecs
from typing import Protocol


class Pieces(Protocol):
    """What renders a token (:meth:`localspec.llama.runtime.Model.piece`)."""

    def piece(self, token: int) -> bytes: ...


class TextStream:
    """Bytes to text, token by token: holds back partial UTF-8 and text that may start a stop string."""

    def __init__(self, model: Pieces, stop: list[str] | None) -> None:
        self.model = model
        self.stop = [s for s in (stop or []) if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""
        self.done = False

    def push(self, token: int) -> tuple[str, bool]:
        self.pending += self.decoder.decode(self.model.piece(token))
        if self.stop:
            cut = min((i for i in (self.pending.find(s) for s in self.stop) if i >= 0), default=-1)
            if cut >= 0:
                out, self.pending = self.pending[:cut], ""
                self.done = True
                return out, True
        if self.hold and len(self.pending) > self.hold:
            out, self.pending = self.pending[: -self.hold], self.pending[-self.hold :]
            return out, False
        if self.hold:
            return "", False
        out, self.pending = self.pending, ""
        return out, False

    def flush(self) -> str:
        if self.done:
            return ""
        out = self.pending + self.decoder.decode(b"", final=True)
        self.pending = ""
        return out
