"""The public API: ``generate`` (one line) over ``load`` (a reusable :class:`Pipeline`), and the records they
return.

Its parts live in their own modules: :mod:`localspec.pipeline.loading` (``load``, ``generate``, what to run
resolved), :mod:`localspec.pipeline.pipeline` (:class:`Pipeline`), :mod:`localspec.pipeline.results`
(:class:`GenerationResult`); ``localspec/__init__.py`` reads them from here.
"""

from __future__ import annotations

from localspec.constrain.grammar import Grammar
from localspec.decoding.engine import TokenResponse
from localspec.decoding.stats import Comparison, GenerationStats, MemoryReport
from localspec.gguf.pairing import PairInfo
from localspec.pipeline.loading import generate, load
from localspec.pipeline.pipeline import Pipeline
from localspec.pipeline.results import GenerationResult
from localspec.pipeline.tool_calls import ChatResponse, ToolUse
from localspec.settings import DraftSettings

__all__ = [
    "ChatResponse",
    "Comparison",
    "DraftSettings",
    "GenerationResult",
    "GenerationStats",
    "Grammar",
    "MemoryReport",
    "PairInfo",
    "Pipeline",
    "TokenResponse",
    "ToolUse",
    "generate",
    "load",
]
