"""The developer scripts in scripts/, imported as modules for their tests (they are not in the package)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@contextlib.contextmanager
def script(name: str) -> Iterator[ModuleType]:
    """``scripts/<name>.py`` loaded as the module ``name`` for the block (registered in ``sys.modules``
    while it runs: a script's dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
