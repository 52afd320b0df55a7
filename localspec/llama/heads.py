"""The drafting head of a target model: its own MTP layers, or a drafter file that runs in its context.

One interface (:class:`localspec.llama.mtp.MtpHead`'s ``follow`` / ``set_following`` / ``draft`` /
``valid``) for every drafter that reads the target's hidden rows, so one drafter and one loop serve them all
(:class:`localspec.decoding.drafters.MtpDrafter`):

- the file's MTP (NextN) layers, or a Gemma 4 assistant (reading the target's KV cache):
  :mod:`localspec.llama.mtp`;
- an EAGLE-3 or a DFlash drafter (reading a few target layers' input rows):
  :mod:`localspec.llama.feature_heads`.
"""

from __future__ import annotations

from typing import Any

import llama_cpp

from localspec.errors import GGUFError, LocalspecError
from localspec.llama import head_calls
from localspec.llama.feature_heads import HEADS, DFlashHead, Eagle3Head
from localspec.llama.logs import cache_bytes_logged, quiet_stderr
from localspec.llama.mtp import MtpHead, layer_count

#: what drafts for a target: its MTP layers or an assistant (:class:`MtpHead`), or an EAGLE-3 or DFlash
#: drafter (:mod:`localspec.llama.feature_heads`)
Head = MtpHead | Eagle3Head | DFlashHead


def _load_file(path: str, n_gpu_layers: int) -> Any:
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise LocalspecError(
            f"llama.cpp could not load the drafter {path}",
            hint="check the file (`localspec pair TARGET DRAFTER`), or draft with a small model of the "
            "target's family",
        )
    return model


def file_head(
    path: str, target_ctx: Any, *, n_gpu_layers: int, n_ctx: int, n_batch: int, n_threads: int
) -> Head:
    """The head of a drafter file: an EAGLE-3 or DFlash drafter, or an MTP assistant (Gemma 4's), its
    context linked to the target's (llama.cpp's ``ctx_other``, as ``common_speculative_init_result`` does).

    Args:
        path: the drafter GGUF.
        target_ctx: the target's ``llama_context``.
        n_gpu_layers: layers on the GPU (-1: all), as the target's.
        n_ctx, n_batch, n_threads: as :class:`MtpHead` takes them.

    Returns:
        The head (it frees the drafter's model when closed).

    Raises:
        LocalspecError: llama.cpp could not load the file or make its context, or the file drafts for
            another target (another width or layers), or is neither kind (an ordinary model).
    """
    model = _load_file(path, n_gpu_layers)
    kind = HEADS.get(head_calls.meta_str(model, "general.architecture") or "")
    if kind is not None:
        return kind(model, target_ctx, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
    head = MtpHead(model, target_ctx, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, owns_model=True)
    if not head.shared:
        head.close()
        raise LocalspecError(
            f"{path} does not read its target's memory or layers: it is not an MTP assistant, EAGLE-3 or "
            "DFlash drafter",
            hint="give it as an ordinary draft model, or use the drafter published with the target",
        )
    return head


def start_head(
    model: Any,
    ctx: Any,
    *,
    what: str,
    assistant: str | None,
    n_gpu_layers: int,
    n_ctx: int,
    n_batch: int,
    n_threads: int,
) -> tuple[Head, int | None]:
    """The drafting head of a loaded model: of its own MTP layers (a quant may have dropped them), or of a
    drafter file ``assistant`` (:func:`file_head`).

    Args:
        model: the loaded ``llama_model`` pointer.
        ctx: its context.
        what: the model file, for errors.
        assistant: a drafter file to draft with instead of MTP layers of its own.
        n_gpu_layers: the model's layers on a GPU (a drafter file's follow them).
        n_ctx: the context each sequence has.
        n_batch: the model's batch.
        n_threads: CPU threads.

    Returns:
        The head, and the KV cache its context allocated as llama.cpp logged it (0 for an assistant, which
        reads the model's; None when the log was not captured).

    Raises:
        GGUFError: the file has no MTP layers.
    """
    if assistant is not None:
        with quiet_stderr() as said:
            head = file_head(
                assistant, ctx, n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads
            )
        return head, 0 if head.shared else cache_bytes_logged(said.lines)
    if layer_count(model) == 0:
        raise GGUFError(
            what,
            "this file has no MTP layers (the model family may have none, or this quant dropped them)",
            hint="use a quant that keeps them (often named MTP), or draft with a small model of the same "
            "family (--draft PATH) or ngram",
        )
    with quiet_stderr() as said:
        head = MtpHead(model, ctx, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
    return head, cache_bytes_logged(said.lines)
