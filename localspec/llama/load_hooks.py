"""Changing, for one load, what llama-cpp-python's ``Llama`` hands llama.cpp.

``Llama`` builds its model and context parameters itself and has no argument for some of them (``load_mtp``,
``n_rs_seq``, the offload devices): a class or function it calls is replaced by one that sets them, for the
load only, under one lock so that two loads in two threads never see each other's changes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: Held by every load that changes what ``Llama`` calls (re-entrant: one load may change several things).
LOAD_LOCK = threading.RLock()


@contextlib.contextmanager
def replaced(owner: Any, name: str, replacement: Callable[[Any], Any]) -> Iterator[None]:
    """While the block runs, ``owner.<name>`` is ``replacement(original)``, under :data:`LOAD_LOCK`.

    Args:
        owner: the module holding it (``llama_cpp._internals``, ``llama_cpp.llama_cpp``).
        name: what ``Llama`` calls (``"LlamaModel"``, ``"LlamaContext"``, ``"llama_model_default_params"``).
        replacement: makes the replacement from the original (a subclass, a wrapping function).
    """
    with LOAD_LOCK:
        original = getattr(owner, name)
        setattr(owner, name, replacement(original))
        try:
            yield
        finally:
            setattr(owner, name, original)
