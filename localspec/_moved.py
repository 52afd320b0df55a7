"""Where the modules of localspec 0.1's flat layout went: their old import paths keep working for one release.

``import localspec.engine`` (or unpickling a result that names ``localspec.api``) still finds the module at
its new place, :data:`MOVED` says where, and a :class:`DeprecationWarning` names the path to use instead.
Three old modules gave their names to the folders that now hold them (:data:`FOLDED`): those folders'
``__init__`` forward the old module's names (:func:`folded_getattr`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

MOVED: dict[str, str] = {
    "localspec.gguf_meta": "localspec.gguf.meta",
    "localspec.vocab": "localspec.gguf.vocab",
    "localspec.pairing": "localspec.gguf.pairing",
    "localspec.scan": "localspec.gguf.scan",
    "localspec.presets": "localspec.hub.presets",
    "localspec.hub_search": "localspec.hub.search",
    "localspec.runtime": "localspec.llama.runtime",
    "localspec.llama_build": "localspec.llama.build",
    "localspec.chat_tokens": "localspec.llama.chat_tokens",
    "localspec.sampling": "localspec.llama.sampling",
    "localspec.grammar": "localspec.constrain.grammar",
    "localspec.number_ranges": "localspec.constrain.number_ranges",
    "localspec.engine": "localspec.decoding.engine",
    "localspec.drafters": "localspec.decoding.drafters",
    "localspec.adaptive": "localspec.decoding.adaptive",
    "localspec.routing": "localspec.decoding.routing",
    "localspec.costs": "localspec.decoding.costs",
    "localspec.stats": "localspec.decoding.stats",
    "localspec.store": "localspec.suffix.store",
    "localspec.api": "localspec.pipeline.api",
    "localspec.tool_calls": "localspec.pipeline.tool_calls",
    "localspec.workloads": "localspec.bench.workloads",
    "localspec.sessions": "localspec.bench.sessions",
    "localspec.benchmath": "localspec.bench.arithmetic",
    "localspec.report": "localspec.bench.report",
    "localspec.peer": "localspec.bench.peer",
    "localspec.tune": "localspec.bench.tune",
    "localspec.session_bench": "localspec.bench.session_run",
    "localspec.replay": "localspec.bench.replay",
    "localspec.server": "localspec.serve.app",
    "localspec.exposure": "localspec.serve.exposure",
}

#: old modules whose names are now folders, and where their contents went
FOLDED: dict[str, str] = {
    "localspec.bench": "localspec.bench.single",
    "localspec.hub": "localspec.hub.download",
    "localspec.suffix": "localspec.suffix.drafter",
}


def moved_warning(old: str, new: str) -> None:
    """Warn once per import that ``old`` is now ``new``."""
    warnings.warn(
        f"{old} moved to {new}: import it from there (the old path goes in the next release)",
        DeprecationWarning,
        stacklevel=3,
    )


def folded_getattr(package: str) -> Callable[[str], object]:
    """The module ``__getattr__`` of a folder that took an old module's name: the old names, with a warning.

    Args:
        package: the folder's dotted name, a key of :data:`FOLDED`.

    Returns:
        A function for the folder's ``__getattr__`` (PEP 562).
    """
    target = FOLDED[package]

    def __getattr__(name: str) -> object:
        if name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is not None:
            # a dunder, or one of the folder's own modules not yet imported: the import system's business
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(target)
        if not hasattr(module, name):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        moved_warning(f"{package}.{name}", f"{target}.{name}")
        return getattr(module, name)

    return __getattr__


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module name to the module at its new place (the same object, not a copy)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED[module.__name__]
        moved_warning(module.__name__, new)
        # importlib returns what sys.modules holds under the old name once this returns
        sys.modules[module.__name__] = importlib.import_module(new)


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (importing ``localspec`` does this)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
