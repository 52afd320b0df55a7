"""The llama.cpp calls EAGLE-3 and DFlash drafting needs that llama-cpp-python does not bind.

``libllama`` exports them from ``llama-ext.h`` as C++ functions (mangled names), beside the MTP calls
llama-cpp-python binds in ``llama_cpp.llama_cpp_ext``: which target layers a drafter reads, and the switch
and buffer for those layers' input rows. They are bound here on first use; a ``libllama`` without them (an
older or newer llama-cpp-python) gives a clear error instead of a crash.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import llama_cpp

from localspec.errors import LocalspecError

_CTX = llama_cpp.llama_context_p_ctypes
_MODEL = llama_cpp.llama_model_p_ctypes

#: name -> (exported symbol names (Itanium, MSVC), argument types, result type)
_CALLS: dict[str, tuple[tuple[str, ...], list[Any], Any]] = {
    "set_layer_inp": (
        (
            "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
            "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z",
        ),
        [_CTX, ctypes.c_uint32, ctypes.c_bool],
        None,
    ),
    "get_layer_inp": (
        (
            "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
            "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z",
        ),
        [_CTX, ctypes.c_uint32],
        ctypes.POINTER(ctypes.c_float),
    ),
    "layer_ids": (
        (
            "_Z28llama_model_target_layer_idsPK11llama_model",
            "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z",
        ),
        [_MODEL],
        ctypes.POINTER(ctypes.c_int32),
    ),
    "layer_ids_n": (
        (
            "_Z30llama_model_target_layer_ids_nPK11llama_model",
            "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z",
        ),
        [_MODEL],
        ctypes.c_uint32,
    ),
    "selector_top_k": (
        (
            "_Z33llama_model_dflash_selector_top_kPK11llama_model",
            "?llama_model_dflash_selector_top_k@@YAHPEBUllama_model@@@Z",
        ),
        [_MODEL],
        ctypes.c_int32,
    ),
}


@functools.cache
def _call(name: str) -> Any:
    symbols, argtypes, restype = _CALLS[name]
    lib = llama_cpp.llama_cpp._lib
    for symbol in symbols:
        func = getattr(lib, symbol, None)
        if func is not None:
            func.argtypes, func.restype = argtypes, restype
            return func
    raise LocalspecError(
        f"this llama-cpp-python's libllama lacks {symbols[0]} (needed to draft with EAGLE-3 or DFlash files)",
        hint="install the llama-cpp-python version localspec names (pip install -e .), or draft with a small "
        "model of the target's family",
    )


def target_layer_ids(model: Any) -> list[int]:
    """The target layers whose input rows a drafter file reads (its ``extract_layers`` / ``target_layers``).

    Args:
        model: the drafter's ``llama_model`` pointer.

    Returns:
        The layer indices, in the order the drafter concatenates them.
    """
    n = int(_call("layer_ids_n")(model))
    ids = _call("layer_ids")(model)
    return [int(ids[i]) for i in range(n)] if n and ids else []


def set_layer_rows(ctx: Any, layer: int, on: bool) -> None:
    """Whether each pass of ``ctx`` keeps the input rows of layer ``layer`` (every token's)."""
    _call("set_layer_inp")(ctx, layer, on)


def layer_rows(ctx: Any, layer: int) -> Any:
    """The input rows of layer ``layer`` in ``ctx``'s last pass (a float pointer; None when not kept)."""
    ptr = _call("get_layer_inp")(ctx, layer)
    return ptr if ptr else None


def selector_top_k(model: Any) -> int:
    """A DFlash2 drafter's selector width (0: a DFlash or DSpark drafter, which has no selector)."""
    return int(_call("selector_top_k")(model))


def meta_str(model: Any, key: str) -> str | None:
    """A loaded model's header value ``key`` as text (None when the header has no such key).

    Args:
        model: a ``llama_model`` pointer.
        key: the GGUF key, e.g. ``general.architecture``.

    Returns:
        The value, or None.
    """
    buf = ctypes.create_string_buffer(128)
    if llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf)) < 0:
        return None
    return buf.value.decode("utf-8", "replace")
