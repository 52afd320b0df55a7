"""One llama.cpp model and its KV cache, driven through llama-cpp-python's low-level calls.

Why not ``Llama.generate`` or llama-cpp-python's ``draft_model=`` hook: that path forces
``logits_all=True`` (n_ctx x n_vocab float32 logits kept in host memory, 2.5 GB for a 152K vocabulary
at n_ctx 4096), computes output rows for every prompt token, and re-evaluates tokens it already holds.
Measured on the Qwen2.5-Coder 1.5B/0.5B pair on a 2-core CPU it ran at 0.24x of the target alone.
Here each decode asks for output rows only at the positions that are verified (each row of a 152K
vocabulary costs about 14 ms on that machine), and :class:`Model` tracks exactly which tokens its KV
cache holds, so nothing is evaluated twice, across rounds and across calls.

Sizes come from llama.cpp, never from what was asked: llama.cpp rounds ``n_ctx`` up (to 256) and
sets its batch to ``min(n_ctx asked, n_batch asked)``, and a decode with more tokens than that batch
aborts the process. So :attr:`Model.n_ctx` and :attr:`Model.n_batch` are read back from the context;
a prefill goes in chunks of the real batch; a pass that must return logits rows is always ONE decode
(the rows of earlier chunks do not exist), which bounds a verified draft by :attr:`Model.max_draft`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp
import numpy as np

from localspec import constants
from localspec.errors import (
    ContextOverflowError,
    GGUFError,
    LocalspecError,
    ModelNotFoundError,
    RpcError,
    SettingsError,
)
from localspec.llama import mtp as mtp_layers
from localspec.llama import recurrent, rpc
from localspec.llama.build import check_amx
from localspec.llama.logs import Said, quiet_stderr
from localspec.llama.sequence import ContextHandle, Sequence, sequences_asked
from localspec.settings import N_CTX_RANGE, max_threads


def check_load_settings(*, n_ctx: int, n_threads: int, n_gpu_layers: int, what: str = "model") -> None:
    """Refuse values llama.cpp would crash on or spend without bound, before anything loads."""
    low, high = N_CTX_RANGE
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or not low <= n_ctx <= high:
        raise SettingsError(
            f"n_ctx {n_ctx!r} is out of range for the {what}",
            hint=f"use a whole number from {low} to the model's trained context (4096 is usual)",
        )
    top = max_threads()
    if isinstance(n_threads, bool) or not isinstance(n_threads, int) or not 1 <= n_threads <= top:
        raise SettingsError(
            f"threads {n_threads!r} is out of range for the {what}",
            hint=f"use 1 to {top} on this machine ({os.cpu_count()} logical cores); "
            "the physical core count is usually fastest",
        )
    if isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, int) or n_gpu_layers < -1:
        raise SettingsError(
            f"GPU layers {n_gpu_layers!r} is not valid for the {what}",
            hint="use -1 (all layers), 0 (CPU only) or a number of layers",
        )


def supports_gpu_offload() -> bool:
    """True when this llama-cpp-python build can offload layers to a GPU here (CUDA, Metal, Vulkan...).

    llama.cpp's own ``llama_supports_gpu_offload`` is also true for a CPU build with the RPC backend, whose
    offloaded layers can only go to rpc-servers: then a local GPU device is looked for in ggml's registry.
    """
    if not llama_cpp.llama_supports_gpu_offload():
        return False
    return not rpc.supported() or rpc.has_local_gpu()


def default_gpu_layers(requested: int | None, *, offload: bool) -> int:
    """Layers to offload: an explicit ``requested`` value wins; otherwise all (-1) when the build can
    offload (``offload``), else none (0). Pure, so the decision is tested without a GPU."""
    if requested is not None:
        return requested
    return -1 if offload else 0


def check_sequences(n_seq: int, *, mtp: bool, what: str = "model") -> None:
    """Refuse a number of sequences llama.cpp cannot hold, or MTP layers asked to draft for several.

    Args:
        n_seq: sequences the context is to hold.
        mtp: whether MTP layers (or an MTP assistant) are loaded with it.
        what: the model, for the message.
    """
    top = int(llama_cpp.llama_max_parallel_sequences())
    if isinstance(n_seq, bool) or not isinstance(n_seq, int) or not 1 <= n_seq <= top:
        raise SettingsError(
            f"parallel {n_seq!r} is out of range for the {what}",
            hint=f"use 1 to {top} sequences at once",
        )
    if mtp and n_seq > 1:
        raise SettingsError(
            f"the MTP layers of {what} draft for one sequence at a time, and {n_seq} were asked for",
            hint="use parallel 1 with MTP, or draft with ngram, suffix or a draft model to run requests "
            "at once",
        )


@dataclass(frozen=True)
class _Part:
    """One sequence's share of a pass: its tokens (owed ones in front) and the logits rows it asks for."""

    seq: Sequence
    tokens: list[int]
    outputs: int


T = TypeVar("T")
#: llama.cpp objects of models whose RPC server was lost: never freed (that would talk to the dead server
#: again, on whichever thread collected them), kept here so the garbage collector never tries.
_LOST: list[Any] = []


def rpc_placement(said_lines: list[str], names: dict[str, str], n_layer: int) -> str:
    """Where llama.cpp put each repeating layer of an RPC-backed model, from its load log
    (``layer 3 assigned to device RPC1``): ``RPC 127.0.0.1:50052 14/28 layers, ...; CPU 0/28``.

    Args:
        said_lines: the load's log lines (:class:`Said`).
        names: ggml device name -> what to call it (``RPC0`` -> ``127.0.0.1:50052``).
        n_layer: the model's repeating layers (the output layer, numbered ``n_layer``, is not counted).

    Returns:
        The summary; ``RPC over ...`` without counts when the log was not captured (LOCALSPEC_VERBOSE).
    """
    counts: dict[str, int] = {}
    for line in said_lines:
        head, sep, device = line.partition(" assigned to device ")
        words = head.split()
        if sep and len(words) >= 2 and words[-2] == "layer" and words[-1].isdigit():
            if int(words[-1]) < n_layer:
                name = device.split(",")[0].strip()
                counts[name] = counts.get(name, 0) + 1
    if not counts:
        return "RPC over " + ", ".join(names.values())
    parts = [f"{names.get(name, name)} {n}/{n_layer}" for name, n in counts.items() if name in names]
    local = sum(n for name, n in counts.items() if name not in names)
    text = "RPC " + ", ".join(parts) + " layers"
    return text + (f"; this machine {local}/{n_layer}" if local else "")


_CACHE_BUFFER = re.compile(r"\b(?:KV|RS) buffer size =\s*([0-9.]+) MiB")


def cache_bytes_logged(said_lines: list[str]) -> int | None:
    """The bytes of every KV-cache and recurrent-state buffer a model's load log names
    (``llama_kv_cache:        CPU KV buffer size =    56.00 MiB``), or None when it names none.

    Args:
        said_lines: the load's log lines (:class:`Said`).

    Returns:
        Their sum in bytes, or None.
    """
    sizes = [float(m.group(1)) for line in said_lines for m in _CACHE_BUFFER.finditer(line)]
    return round(sum(sizes) * 1024 * 1024) if sizes else None


def placement(n_gpu_layers: int, n_layer: int, *, offload: bool) -> str:
    """Where a model runs, for people: ``CPU``, ``GPU (all layers)`` or ``GPU 10/28 layers, rest CPU``."""
    if not offload or n_gpu_layers == 0:
        return "CPU"
    if n_gpu_layers < 0 or n_gpu_layers >= n_layer:
        return "GPU (all layers)"
    return f"GPU {n_gpu_layers}/{n_layer} layers, rest CPU"


class Model:
    """A loaded GGUF model with its own context and batch, holding :attr:`sequences` (one per generation that
    may run at once: :class:`~localspec.llama.sequence.Sequence`) in one KV cache.

    ``n_ctx`` (per sequence) and ``n_batch`` are llama.cpp's real values (read back after loading);
    ``n_ctx_train`` is the context the model was trained on (the pipeline keeps ``n_ctx`` within it). The
    calls that work on one sequence take it as ``seq`` and default to sequence 0 (:attr:`seq0`).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_ctx: int,
        n_threads: int,
        n_gpu_layers: int = 0,
        n_batch: int = 512,
        rpc_servers: Seq[rpc.Endpoint] = (),
        tensor_split: Seq[float] | None = None,
        rollback_depth: int = 0,
        mtp: bool = False,
        mtp_assistant: str | os.PathLike | None = None,
        n_seq: int = 1,
    ) -> None:
        """Load the model.

        Args:
            path: the GGUF file.
            n_ctx: the context asked for (llama.cpp rounds it up).
            n_threads: CPU threads.
            n_gpu_layers: layers offloaded to the GPU or, with ``rpc_servers``, to the servers (-1: all).
            n_batch: the batch asked for (llama.cpp caps it at ``n_ctx``).
            rpc_servers: llama.cpp rpc-servers that hold the offloaded layers (:mod:`localspec.llama.rpc`);
                every llama.cpp call then runs on the model's :class:`rpc.Guard`.
            tensor_split: each server's share of the offloaded layers (default: by free memory).
            rollback_depth: for a model with recurrent memory, the state snapshots to keep per sequence
                (the longest draft taken back without a checkpoint: :mod:`localspec.llama.recurrent`);
                ignored for a transformer and for architectures llama.cpp keeps no snapshots for.
            mtp: load the file's MTP (NextN) layers and make their context (:attr:`mtp`), which follows every
                pass of this model (:mod:`localspec.llama.mtp`).
            mtp_assistant: an MTP assistant file (Gemma 4's) to draft for this model instead of MTP layers of
                its own: its head reads this model's KV cache (:func:`localspec.llama.mtp.assistant_head`).
            n_seq: sequences held at once (each with ``n_ctx`` tokens of room, in one unified KV cache); the
                MTP layers draft for one sequence only.

        Raises:
            RpcError: a server that does not answer, or one lost while loading.
        """
        self.path = Path(path)
        check_load_settings(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, what=self.path.name)
        check_sequences(n_seq, mtp=mtp or mtp_assistant is not None, what=self.path.name)
        self._batch: Any = None
        self._llama: llama_cpp.Llama | None = None
        #: the MTP head drafting for this model (None unless loaded with ``mtp``)
        self.mtp: mtp_layers.MtpHead | None = None
        self._mtp_cache_bytes: int | None = None
        self.rpc_servers = list(rpc_servers)
        self._guard: rpc.Guard | None = None
        self._rpc_placement = ""
        if not self.path.is_file():
            raise ModelNotFoundError(
                f"{self.path}: no such model file",
                hint="check the path, or run `localspec scan` to list the models on this machine",
            )
        devices, labels = self._place(
            n_threads=n_threads, n_gpu_layers=n_gpu_layers, tensor_split=tensor_split
        )
        said = self._load(
            devices,
            n_ctx=n_ctx * n_seq,
            n_seq=n_seq,
            n_batch=n_batch,
            n_threads=n_threads,
            n_gpu_layers=n_gpu_layers,
            tensor_split=tensor_split,
            rollback_depth=rollback_depth,
            mtp=mtp and mtp_assistant is None,
        )
        self._read_back(said, devices, labels, n_gpu_layers=n_gpu_layers)
        if mtp_assistant is not None:
            self._start_mtp(n_threads, assistant=Path(mtp_assistant))
        elif mtp:
            self._start_mtp(n_threads)

    def _place(
        self, *, n_threads: int, n_gpu_layers: int, tensor_split: Seq[float] | None
    ) -> tuple[Any, dict[str, str]]:
        """Where the layers go: the rpc-servers' devices and their labels (``RPC0`` -> ``host:port``), the
        split checked and the model's :class:`rpc.Guard` made; else (None, {}) after the AMX check of a
        local load."""
        devices, labels = None, {}
        if self.rpc_servers:  # the layers on the servers: the local CPU's AMX kernels are not the question
            devices = rpc.devices(self.rpc_servers)
            servers = map(str, self._device_servers(devices))
            labels = dict(zip(rpc.device_names(devices), servers, strict=True))  # RPC0 -> host:port
            if tensor_split:
                rpc.check_tensor_split(list(tensor_split), [f"{n} {e}" for n, e in labels.items()])
            self._guard = rpc.Guard(self.rpc_servers, self.path.name)
        else:
            check_amx(self.path, n_threads=n_threads, n_gpu_layers=n_gpu_layers)  # a crash there kills us
        return devices, labels

    def _load(
        self,
        devices: Any,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        n_gpu_layers: int,
        tensor_split: Seq[float] | None,
        rollback_depth: int,
        mtp: bool,
        n_seq: int,
    ) -> Said:
        """llama.cpp loads the file (its load log kept quiet and returned); its refusal becomes a
        :class:`GGUFError` with llama.cpp's own reason, and a Ctrl-C during the load is honoured after it."""
        said = Said()

        def load() -> llama_cpp.Llama:
            return llama_cpp.Llama(
                model_path=str(self.path),
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_ubatch=n_batch,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                n_gpu_layers=n_gpu_layers,
                tensor_split=list(tensor_split) if tensor_split else None,
                logits_all=False,
                verbose=constants.verbose(),  # LOCALSPEC_VERBOSE: its load log, on stderr
            )

        try:
            with (
                _interrupt_after() as interrupted,
                quiet_stderr() as said,
                rpc.load_devices(devices),
                recurrent.snapshots_asked(rollback_depth),
                sequences_asked(n_seq),
                mtp_layers.layers_asked(mtp),
            ):
                self._llama = self._call(load)
        except (ValueError, RuntimeError, OSError) as exc:
            if isinstance(exc, LocalspecError):  # an RpcError: already says which server and what to do
                raise
            # llama.cpp's own reason (an architecture this build does not know, a tensor out of bounds)
            why = next((e for e in reversed(said.errors) if "error loading model" in e), None)
            why = why or (said.errors[-1] if said.errors else str(exc))
            hint = None
            if "unknown model architecture" in why:
                hint = (
                    f"llama-cpp-python {llama_cpp.__version__} does not run this architecture: a newer "
                    "release may (pip install -U llama-cpp-python), or pick a model of another family"
                )
            raise GGUFError(
                str(self.path), f"llama.cpp could not load this model: {why[:300]}", hint=hint
            ) from None
        if interrupted:  # Ctrl-C while llama.cpp loaded: honoured now that it is done
            self.close()
            raise KeyboardInterrupt
        return said

    def _read_back(self, said: Said, devices: Any, labels: dict[str, str], *, n_gpu_layers: int) -> None:
        """What llama.cpp made of the load: its context, vocabulary and sizes, and this model's KV
        bookkeeping, rollback state and batch."""
        assert self._llama is not None, "loaded by _load"
        self.ctx = self._llama._ctx.ctx
        self.model = self._llama._model.model
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self.model))
        self.n_gpu_layers = n_gpu_layers
        self.n_layer = int(llama_cpp.llama_model_n_layer(self.model))
        if devices is not None:
            self._rpc_placement = rpc_placement(said.lines, labels, self.n_layer)
        self._cache_bytes = cache_bytes_logged(said.lines)
        # llama.cpp's own numbers: it rounds n_ctx up and caps the batch at the n_ctx asked for.
        n_seq = int(llama_cpp.llama_n_seq_max(self.ctx))
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx)) // n_seq  # each sequence's room
        self.n_batch = int(llama_cpp.llama_n_batch(self.ctx))
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        #: "attention", "hybrid" or "recurrent": how rejected drafts leave this model's memory
        self.memory_kind = recurrent.memory_kind(self.model)
        #: recurrent-state snapshots llama.cpp keeps per sequence (0: a rollback needs a checkpoint)
        self.n_rs_seq = int(llama_cpp.llama_n_rs_seq(self.ctx))
        handle = ContextHandle(
            self.ctx, self.memory, self.memory_kind, self.n_rs_seq, n_seq, self.path.name, self._call
        )
        #: the sequences this context holds, by llama.cpp's sequence id
        self.sequences = [Sequence(handle, i) for i in range(n_seq)]
        self.seq0 = self.sequences[0]
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        for i in range(self.n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._piece_buf = ctypes.create_string_buffer(64)
        self._textless: np.ndarray | None = None
        self._space: np.ndarray | None = None
        self.eog_ids = frozenset(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)
        )

    def _start_mtp(self, n_threads: int, assistant: Path | None = None) -> None:
        """Make the MTP context: of this file's MTP layers (a quant may have dropped them), or of an
        ``assistant`` file that reads this model's memory."""
        if assistant is not None:
            self._start_assistant(n_threads, assistant)
            return
        if mtp_layers.layer_count(self.model) == 0:
            self.close()
            raise GGUFError(
                str(self.path),
                "this file has no MTP layers (the model family may have none, or this quant dropped them)",
                hint="use a quant that keeps them (often named MTP), or draft with a small model of the same "
                "family (--draft PATH) or ngram",
            )
        with quiet_stderr() as said:
            try:
                self.mtp = self._call(
                    lambda: mtp_layers.MtpHead(
                        self.model, self.ctx, n_ctx=self.n_ctx, n_batch=self.n_batch, n_threads=n_threads
                    )
                )
            except LocalspecError:
                self.close()
                raise
        self._mtp_cache_bytes = cache_bytes_logged(said.lines)

    def _start_assistant(self, n_threads: int, assistant: Path) -> None:
        """The MTP head of an assistant file; it reads this model's KV cache, so it adds none."""
        with quiet_stderr():
            try:
                self.mtp = self._call(
                    lambda: mtp_layers.assistant_head(
                        str(assistant),
                        self.ctx,
                        n_gpu_layers=self.n_gpu_layers,
                        n_ctx=self.n_ctx,
                        n_batch=self.n_batch,
                        n_threads=n_threads,
                    )
                )
            except LocalspecError:
                self.close()
                raise
        self._mtp_cache_bytes = 0

    def follow_mtp(self, on: bool) -> None:
        """Whether this model's passes feed its MTP head (nothing without one): off, they cost nothing more
        (a strategy that does not draft with it), and the head evaluates what it missed when it drafts
        again."""
        head = self.mtp
        if head is not None:
            self._call(lambda: head.set_following(on))

    def mtp_bytes(self) -> int:
        """Memory the MTP head adds: its context's KV cache as llama.cpp allocated it (0 without MTP, and for
        an assistant, which reads this model's). Its weights are part of the file, and of
        :attr:`weights_bytes` once loaded; an assistant's are its own (``mtp.weights_bytes``)."""
        if self.mtp is None:
            return 0
        if self._mtp_cache_bytes is not None:
            return self._mtp_cache_bytes
        meta = self.metadata
        arch = meta.get("general.architecture", "")
        n_head = max(1, llama_cpp.llama_model_n_head(self.model))
        n_embd = llama_cpp.llama_model_n_embd(self.model)
        k_len = int(meta.get(f"{arch}.attention.key_length", n_embd // n_head))
        v_len = int(meta.get(f"{arch}.attention.value_length", n_embd // n_head))
        n_head_kv = llama_cpp.llama_model_n_head_kv(self.model)
        return self.n_ctx * self.mtp.n_layers * n_head_kv * (k_len + v_len) * 2

    def _device_servers(self, devices: list[int]) -> list[rpc.Endpoint]:
        """The server of each device (an rpc-server may offer several)."""
        out: list[rpc.Endpoint] = []
        for server in self.rpc_servers:
            out += [server] * len(rpc.devices([server]))
        return out[: len(devices)]

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` where this model's llama.cpp calls run: on the RPC guard's thread for a model with layers
        on rpc-servers, else here (for a part that works on this model's contexts, as its MTP head)."""
        return self._call(fn)

    def _call(self, fn: Callable[[], T]) -> T:
        """``fn()``: on the RPC guard's thread for a model with layers on rpc-servers, else here."""
        if self._guard is None:
            return fn()
        try:
            return self._guard.call(fn)
        except RpcError:
            if self._guard.broken and self._llama is not None:
                _LOST.append(self._llama)  # never collected: freeing it would talk to the lost server
            raise

    # Facts ------------------------------------------------------------------------------------
    @property
    def max_draft(self) -> int:
        """The longest draft one verify pass can check: the pending token plus the drafts must fit one
        llama.cpp batch (every logits row of a pass must come from one decode), and the context.

        The engine caps each round at this and at the context room left; a setting that asks for more
        (``n_max``) is refused up front with a :class:`SettingsError` rather than silently shortened.
        """
        return max(0, min(self.n_batch, self.n_ctx) - 1)

    @property
    def placement(self) -> str:
        """Where this model runs: ``CPU``, ``GPU (all layers)``, a split, or its layers over rpc-servers."""
        if self._rpc_placement:
            return self._rpc_placement
        return placement(self.n_gpu_layers, self.n_layer, offload=supports_gpu_offload())

    @property
    def llama(self) -> llama_cpp.Llama:
        """llama-cpp-python's object for this model (raises once the model is closed)."""
        if self._llama is None:
            raise LocalspecError(f"{self.path.name}: this model was closed", hint="load it again")
        return self._llama

    @property
    def metadata(self) -> dict[str, str]:
        return self.llama.metadata

    @property
    def weights_bytes(self) -> int:
        return int(llama_cpp.llama_model_size(self.model))

    def kv_bytes(self) -> int:
        """The memory of this model's context: the KV cache and, for a recurrent or hybrid model, its
        recurrent states with their snapshots, as llama.cpp allocated them (its load log). Without the log
        (LOCALSPEC_VERBOSE shows it on the terminal instead), the KV cache from n_ctx, layers, KV heads and
        head sizes (f16: 2 bytes), which counts every layer of a hybrid as attention."""
        if self._cache_bytes is not None:
            return self._cache_bytes
        meta = self.metadata
        arch = meta.get("general.architecture", "")
        n_layer = llama_cpp.llama_model_n_layer(self.model)
        n_head = max(1, llama_cpp.llama_model_n_head(self.model))
        n_head_kv = llama_cpp.llama_model_n_head_kv(self.model)
        n_embd = llama_cpp.llama_model_n_embd(self.model)
        k_len = int(meta.get(f"{arch}.attention.key_length", n_embd // n_head))
        v_len = int(meta.get(f"{arch}.attention.value_length", n_embd // n_head))
        return self.n_ctx * n_layer * n_head_kv * (k_len + v_len) * 2

    # Tokens -----------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def piece(self, token: int) -> bytes:
        """Raw bytes of one token as it continues a text (special tokens render as nothing)."""
        n = llama_cpp.llama_token_to_piece(self.vocab, token, self._piece_buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    def textless_ids(self) -> np.ndarray:
        """Ids that render as no text and do not end a generation (control tokens): computed once, with a
        buffer of its own (callers need not hold the engine's lock, unlike :meth:`piece`)."""
        if self._textless is None:
            buf = ctypes.create_string_buffer(8)
            to_piece, vocab, eog = llama_cpp.llama_token_to_piece, self.vocab, self.eog_ids
            # a piece longer than the buffer answers its length, negated: not empty either way
            ids = [
                t for t in range(self.n_vocab) if t not in eog and to_piece(vocab, t, buf, 8, 0, False) == 0
            ]
            self._textless = np.array(ids, dtype=np.int64)
        return self._textless

    def space_ids(self) -> np.ndarray:
        """Ids whose text is whitespace only (a space, newlines, indentation): computed once, with a buffer
        of its own (like :meth:`textless_ids`)."""
        if self._space is None:
            buf = ctypes.create_string_buffer(128)
            to_piece, vocab = llama_cpp.llama_token_to_piece, self.vocab
            ids = []
            for t in range(self.n_vocab):
                n = to_piece(vocab, t, buf, 128, 0, False)
                if 0 < n and buf.raw[:n].isspace():
                    ids.append(t)
            self._space = np.array(ids, dtype=np.int64)
        return self._space

    # Sequences --------------------------------------------------------------------------------
    @property
    def rollback(self) -> recurrent.RollbackStats:
        """What taking tokens back out of this model's recurrent memory cost so far, every sequence summed."""
        return recurrent.RollbackStats.total(seq.rollback for seq in self.sequences)

    @property
    def tokens(self) -> list[int]:
        """What the KV cache holds for sequence 0 (:attr:`seq0`), in order."""
        return self.seq0.tokens

    @property
    def owed(self) -> int:
        """Tokens sequence 0 holds in name only (after a checkpoint restore): see :attr:`Sequence.owed`."""
        return self.seq0.owed

    def recurrent_state_bytes(self) -> int:
        """Bytes of sequence 0's recurrent state as it stands (0 for a transformer): what a checkpoint copies,
        and what each of the :attr:`n_rs_seq` snapshots costs again."""
        return self.seq0.state_bytes()

    def time_rollback(self) -> tuple[float, float]:
        """Seconds to copy sequence 0's recurrent state out and back, timed once now
        (:meth:`Sequence.time_rollback`)."""
        return self.seq0.time_rollback()

    def checkpoint(self, ahead: int, seq: Sequence | None = None) -> None:
        """Before a pass that appends up to ``ahead`` tokens to ``seq`` (default sequence 0) which may be
        taken back: keep what taking them back needs (:meth:`Sequence.needs_checkpoint`).

        Owed tokens are evaluated first when there are more than :data:`recurrent.OWED_CARRIED` of them: a
        copy taken before them would owe them again after the next restore, round after round."""
        seq = seq or self.seq0
        if not seq.needs_checkpoint(ahead):
            return
        if seq.owed > recurrent.OWED_CARRIED:
            self.decode([], seq)
        seq.save_round()

    def mark_prefix(self, seq: Sequence | None = None) -> None:
        """The tokens ``seq`` (default sequence 0) holds are a prompt later requests may start with again
        (:meth:`Sequence.mark_prefix`)."""
        (seq or self.seq0).mark_prefix()

    def truncate(self, n: int, seq: Sequence | None = None) -> None:
        """Forget every token of ``seq`` (default sequence 0) from position ``n`` on
        (:meth:`Sequence.truncate`)."""
        (seq or self.seq0).truncate(n)

    def sync(self, context: list[int], keep_last: int = 0, seq: Sequence | None = None) -> list[int]:
        """Trim ``seq`` (default sequence 0) to its longest common prefix with ``context`` minus ``keep_last``
        tokens.

        Returns:
            The tokens of ``context`` that still need evaluating.
        """
        seq = seq or self.seq0
        n = seq.common_prefix(context, keep_last)
        seq.truncate(n)
        return context[n:]

    def decode(self, tokens: list[int], seq: Sequence | None = None) -> None:
        """Evaluate ``tokens`` after the ones ``seq`` (default sequence 0) holds, without any logits rows
        (a prefill).

        Goes in chunks of the real batch, so any length that fits the context is safe.
        """
        seq = seq or self.seq0
        self._check_room(tokens, seq)
        tokens = seq.take_owed(tokens)
        for start in range(0, len(tokens), self.n_batch):
            self._decode_parts([_Part(seq, tokens[start : start + self.n_batch], 0)])

    def decode_logits(
        self, tokens: list[int], *, outputs: int = 1, seq: Sequence | None = None
    ) -> np.ndarray:
        """Evaluate ``tokens`` after the ones ``seq`` (default sequence 0) holds; return logits rows for the
        last ``outputs``.

        All ``outputs`` rows come from ONE llama.cpp decode (a row of an earlier chunk no longer exists):
        the tokens before them are prefilled first, in chunks. ``outputs`` above :attr:`n_batch` is refused.
        The returned array is a view into llama.cpp's buffer: valid until the next decode.
        """
        if not tokens or not 1 <= outputs <= len(tokens):
            raise ValueError(f"need 1 <= outputs <= {len(tokens)} tokens, got outputs={outputs}")
        self._check_outputs(outputs)
        seq = seq or self.seq0
        self._check_room(tokens, seq)
        tokens = seq.take_owed(tokens)
        head = tokens[: max(0, len(tokens) - self.n_batch)]  # the last chunk is a full batch: all rows in it
        for start in range(0, len(head), self.n_batch):
            self._decode_parts([_Part(seq, head[start : start + self.n_batch], 0)])
        return self._decode_parts([_Part(seq, tokens[len(head) :], outputs)])[0]

    def decode_many(self, parts: list[tuple[Sequence, list[int], int]]) -> list[np.ndarray]:
        """One llama.cpp pass over several sequences: each ``(seq, tokens, outputs)`` evaluates ``tokens``
        after what ``seq`` holds (its owed tokens first) and gets logits rows for its last ``outputs``.

        Every part goes in ONE decode, so the tokens of all parts (owed ones included) must fit one batch
        (:attr:`n_batch`): the caller sizes the pass (:meth:`batch_width`). A part with 0 outputs is a chunk
        of a prefill.

        Returns:
            Per part, its logits rows (``outputs`` x ``n_vocab``; empty for 0), views into llama.cpp's buffer
            valid until the next decode.
        """
        if len({id(seq) for seq, _, _ in parts}) != len(parts):
            raise ValueError("each sequence may appear once in a pass")
        for seq, tokens, outputs in parts:
            if not 0 <= outputs <= len(tokens):
                raise ValueError(f"need 0 <= outputs <= {len(tokens)} tokens, got outputs={outputs}")
            self._check_room(tokens, seq)
        if sum(self.batch_width(seq, tokens) for seq, tokens, _ in parts) > self.n_batch:
            raise SettingsError(
                f"{self.path.name}: a pass of {sum(len(t) for _, t, _ in parts)} tokens over "
                f"{len(parts)} sequences exceeds llama.cpp's batch of {self.n_batch}",
                hint="this is a bug in the caller's sizing of the pass: report it",
            )
        self._check_outputs(sum(outputs for _, _, outputs in parts))
        return self._decode_parts([_Part(seq, seq.take_owed(tokens), out) for seq, tokens, out in parts])

    def batch_width(self, seq: Sequence, tokens: list[int]) -> int:
        """The rows ``tokens`` take in a pass for ``seq``: its owed tokens go in front of them."""
        return seq.owed + len(tokens)

    def _check_outputs(self, outputs: int) -> None:
        if outputs > self.n_batch:
            raise SettingsError(
                f"{self.path.name}: a pass of {outputs} logits rows exceeds llama.cpp's batch of "
                f"{self.n_batch}",
                hint=f"draft at most {self.max_draft} tokens per round (n_max), or load with a larger n_ctx",
            )

    def _check_room(self, tokens: list[int], seq: Sequence) -> None:
        if len(seq.tokens) + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{self.path.name}: {len(seq.tokens) + len(tokens)} tokens do not fit the context of "
                f"{self.n_ctx}",
                hint="use a shorter prompt, a smaller max_tokens, or a larger n_ctx",
            )

    def _decode_parts(self, parts: list[_Part]) -> list[np.ndarray]:
        parts = [p for p in parts if p.tokens]
        if not parts:
            return []
        if self.closed:
            raise LocalspecError(f"{self.path.name}: this model was closed", hint="load it again")
        assert (
            sum(len(p.tokens) for p in parts) <= self.n_batch
        )  # the one rule llama.cpp aborts the process on
        return self._call(lambda: self._decode_now(parts))

    def _decode_now(self, parts: list[_Part]) -> list[np.ndarray]:
        at = 0
        b = self._batch
        for part in parts:
            pos0, n, first_out = len(part.seq.tokens), len(part.tokens), len(part.tokens) - part.outputs
            for i, t in enumerate(part.tokens):
                b.token[at + i] = t
                b.pos[at + i] = pos0 + i
                b.seq_id[at + i][0] = part.seq.seq_id
                b.logits[at + i] = 1 if i >= first_out else 0
            at += n
        b.n_tokens = at
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc != 0:
            for part in parts:
                part.seq.failed_decode()
            raise LocalspecError(
                f"{self.path.name}: llama_decode failed with status {rc}",
                hint="the context may be full: try a larger n_ctx or a shorter prompt",
            )
        for part in parts:
            pos0 = len(part.seq.tokens)
            part.seq.appended(part.tokens)
            if self.mtp is not None:  # loaded with one sequence only
                self.mtp.follow(part.tokens, pos0)
        total = sum(p.outputs for p in parts)
        if total == 0:
            return [np.empty((0, self.n_vocab), dtype=np.float32) for _ in parts]
        rows = np.ctypeslib.as_array(llama_cpp.llama_get_logits(self.ctx), shape=(total, self.n_vocab))
        out, first = [], 0
        for part in parts:
            out.append(rows[first : first + part.outputs])
            first += part.outputs
        return out

    def reset(self) -> None:
        """Empty every sequence."""
        for seq in self.sequences:
            seq.truncate(0)

    @property
    def closed(self) -> bool:
        return self._llama is None

    def close(self) -> None:
        """Free the model (a model whose RPC server was lost is only let go of: see :data:`_LOST`)."""
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self.mtp is not None:
            head, self.mtp = self.mtp, None
            with contextlib.suppress(RpcError):
                self._call(head.close)
        if self._llama is None:
            return
        llama, self._llama = self._llama, None
        try:
            if self._guard is not None and self._guard.broken:
                raise RpcError("lost")
            self._call(llama.close)
        except RpcError:
            _LOST.append(llama)


@contextlib.contextmanager
def _interrupt_after() -> Iterator[list[int]]:
    """Hold Ctrl-C while llama.cpp loads a model, for the caller to raise it after (the list is non-empty
    when it came). Python runs its SIGINT handler at the next bytecode, and during a load that is inside
    llama-cpp-python's log callback, called from C: a KeyboardInterrupt raised there is printed as
    ignored and lost, so a Ctrl-C in the load (0.3-0.7 s for a 1.5B Q4 model from the page cache, seconds
    from a cold disk) let the whole generation run. Only in the main thread with Python's own handler in
    place (a server's or a UI's handler is theirs to keep)."""
    caught: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield caught
        return
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
