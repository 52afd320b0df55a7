"""The public API: ``generate`` (one line) over ``load`` (a reusable :class:`Pipeline`).

Its parts live in their own modules: :mod:`localspec.pipeline.loading` (``load``, ``generate``, what to run
resolved), :mod:`localspec.pipeline.pipeline` (:class:`Pipeline`), :mod:`localspec.pipeline.results`
(:class:`GenerationResult`). This module exports every name it held before the split, for
``localspec/__init__.py``, the old ``localspec.api`` path and results pickled by earlier versions.
"""

from __future__ import annotations

from localspec.constrain.grammar import Grammar
from localspec.decoding.engine import TokenResponse
from localspec.decoding.stats import Comparison, GenerationStats, MemoryReport
from localspec.gguf.pairing import PairInfo
from localspec.pipeline.checks import _checked_stop, _checked_text
from localspec.pipeline.loading import (
    _CACHE,
    _LOAD_KEYS,
    _auto_draft,
    _check_file,
    _preset_settings,
    _short,
    generate,
    load,
)
from localspec.pipeline.pipeline import Pipeline, _blend
from localspec.pipeline.results import GenerationResult, _collect
from localspec.pipeline.tool_calls import ChatResponse, ToolUse
from localspec.settings import DraftSettings

__all__ = [
    "_CACHE",
    "_LOAD_KEYS",
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
    "_auto_draft",
    "_blend",
    "_check_file",
    "_checked_stop",
    "_checked_text",
    "_collect",
    "_preset_settings",
    "_short",
    "generate",
    "load",
]
