"""localspec: speculative decoding for local GGUF models through llama.cpp.

import localspec
print(localspec.generate("def fib(n):"))                       # embedded pair, offline
print(localspec.generate("def fib(n):", preset="qwen2.5-coder-1.5b"))
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "generate",
    "load",
    "Pipeline",
    "GenerationResult",
    "TokenResponse",
    "ChatResponse",
    "GenerationStats",
    "MemoryReport",
    "Comparison",
    "PairInfo",
    "DraftSettings",
    "Grammar",
    "errors",
]


def __getattr__(name: str):
    # Lazy: `import localspec` stays cheap (no llama.cpp load) for the CLI's scan/pair commands.
    if name in ("generate", "load", "Pipeline", "GenerationResult", "ChatResponse", "PairInfo"):
        from localspec.pipeline import api

        return getattr(api, name)
    if name == "TokenResponse":
        from localspec.decoding.engine import TokenResponse

        return TokenResponse
    if name in ("GenerationStats", "MemoryReport", "Comparison"):
        from localspec.decoding import stats

        return getattr(stats, name)
    if name == "Grammar":
        from localspec.constrain.grammar import Grammar

        return Grammar
    if name == "DraftSettings":
        from localspec.settings import DraftSettings

        return DraftSettings
    if name == "errors":
        from localspec import errors

        return errors
    raise AttributeError(f"module 'localspec' has no attribute {name!r}")
