"""What a generation returns: :class:`GenerationResult`, the text with the stats and tokens that made it."""

from __future__ import annotations

from collections.abc import Iterator

from localspec.decoding.engine import TokenResponse
from localspec.decoding.stats import GenerationStats


class GenerationResult(str):
    """The generated text (a ``str``), carrying ``.stats``, ``.tokens``, ``.from_draft`` and ``.pieces``.

    ``pieces`` is the text as it was streamed, one string per token (``"".join(pieces)`` is the text);
    ``sources`` says where each drafted token came from (None for the target's own). It copies and
    pickles like any value (``copy.copy``, ``pickle``), and prints as its text.
    """

    stats: GenerationStats
    tokens: list[int]
    from_draft: list[bool]
    pieces: list[str]
    sources: list[str | None]
    #: a chat reply's calls (:meth:`Pipeline.chat` with ``tools``), in OpenAI's shape
    tool_calls: list[dict]
    #: a chat reply's text outside its calls (OpenAI's ``message.content``); the whole text otherwise
    content: str

    def __new__(
        cls,
        text: str = "",
        stats: GenerationStats | None = None,
        tokens: list[int] | None = None,
        from_draft: list[bool] | None = None,
        pieces: list[str] | None = None,
        sources: list[str | None] | None = None,
    ) -> GenerationResult:
        obj = super().__new__(cls, text)
        obj.stats = stats if stats is not None else GenerationStats()
        obj.tokens = tokens if tokens is not None else []
        obj.from_draft = from_draft if from_draft is not None else []
        obj.pieces = pieces if pieces is not None else []
        obj.sources = sources if sources is not None else []
        obj.tool_calls = []
        obj.content = str(obj)
        return obj

    def __getnewargs__(self) -> tuple[str]:  # copy and pickle: the text; the attributes follow as state
        return (str(self),)

    @property
    def text(self) -> str:
        return str(self)


def collect(stream: Iterator[TokenResponse]) -> GenerationResult:
    parts, tokens, flags, sources = [], [], [], []
    stats = None
    for r in stream:
        parts.append(r.text)
        tokens.append(r.token)
        flags.append(r.from_draft)
        sources.append(r.source)
        stats = r.stats
    if stats is None:  # pragma: no cover - the engine always yields at least one token
        stats = GenerationStats()
    return GenerationResult("".join(parts), stats, tokens, flags, parts, sources)
