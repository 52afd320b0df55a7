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
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp
import numpy as np

from localspec.errors import (
    LocalspecError,
    ModelNotFoundError,
    RpcError,
    SettingsError,
)
from localspec.llama import heads, recurrent, rpc, token_sets
from localspec.llama.loading import (
    LoadAsk,
    check_load_settings,
    check_sequences,
    load_llama,
    place_layers,
    placement,
    rpc_placement,
    supports_gpu_offload,
)
from localspec.llama.logs import Said, cache_bytes_logged
from localspec.llama.prompt_cache import PromptCache
from localspec.llama.sequence import ContextHandle, Sequence


@dataclass(frozen=True)
class _Part:
    """One sequence's share of a pass: its tokens (owed ones in front) and the logits rows it asks for."""

    seq: Sequence
    tokens: list[int]
    outputs: int


def _check_outputs(model: Model, outputs: int) -> None:
    """Refuse a pass of more logits rows than one llama.cpp batch holds (it would abort the process)."""
    if outputs > model.n_batch:
        raise SettingsError(
            f"{model.path.name}: a pass of {outputs} logits rows exceeds llama.cpp's batch of "
            f"{model.n_batch}",
            hint=f"draft at most {model.max_draft} tokens per round (n_max), or load with a larger n_ctx",
        )


def _new_batch(n: int) -> Any:
    """A llama.cpp batch of ``n`` tokens, each of one sequence (set per token when filled)."""
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    for i in range(n):
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
    return batch


T = TypeVar("T")
#: llama.cpp objects of models whose RPC server was lost: never freed (that would talk to the dead server
#: again, on whichever thread collected them), kept here so the garbage collector never tries.
_LOST: list[Any] = []


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
            mtp_assistant: a drafter file to draft for this model instead of MTP layers of its own: an MTP
                assistant (Gemma 4's; it reads this model's KV cache), an EAGLE-3 or a DFlash drafter (they
                read a few of this model's layer rows): :func:`localspec.llama.heads.file_head`.
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
        #: the head drafting for this model from its own rows: its MTP layers or a drafter file (None unless
        #: loaded with ``mtp``)
        self.mtp: heads.Head | None = None
        self._mtp_cache_bytes: int | None = None
        self.rpc_servers = list(rpc_servers)
        self._guard: rpc.Guard | None = None
        self._rpc_placement = ""
        if not self.path.is_file():
            raise ModelNotFoundError(
                f"{self.path}: no such model file",
                hint="check the path, or run `localspec scan` to list the models on this machine",
            )
        mtp_layers_too = mtp and not mtp_assistant
        ask = LoadAsk(
            n_ctx * n_seq,
            n_batch,
            n_threads,
            n_gpu_layers,
            tensor_split,
            rollback_depth,
            mtp_layers_too,
            n_seq,
        )
        said, devices, labels = self._load(ask)
        self._read_back(said, devices, labels, n_gpu_layers=n_gpu_layers)
        if mtp or mtp_assistant is not None:
            self._start_mtp(n_threads, assistant=Path(mtp_assistant) if mtp_assistant else None)

    def _load(self, ask: LoadAsk) -> tuple[Said, Any, dict[str, str]]:
        """The layers placed (rpc-servers get a guard) and llama.cpp's load (a Ctrl-C in it raised after)."""
        devices, labels = place_layers(
            self.path,
            self.rpc_servers,
            n_threads=ask.n_threads,
            n_gpu_layers=ask.n_gpu_layers,
            tensor_split=ask.tensor_split,
        )
        if self.rpc_servers:  # every llama.cpp call of the model runs on the guard's thread
            self._guard = rpc.Guard(self.rpc_servers, self.path.name)
        self._llama, said, interrupted = load_llama(self.path, devices, ask, self._call)
        if interrupted:  # Ctrl-C while llama.cpp loaded: honoured now that it is done
            self.close()
            raise KeyboardInterrupt
        return said, devices, labels

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
        self._batch = _new_batch(self.n_batch)
        self._piece_buf = ctypes.create_string_buffer(64)
        self._textless: np.ndarray | None = None
        self._space: np.ndarray | None = None
        self.eog_ids = token_sets.eog_ids(self.vocab, self.n_vocab)
        #: earlier prompts' states in host memory (:mod:`localspec.llama.prompt_cache`)
        self.prompt_cache: PromptCache | None = None

    def _start_mtp(self, n_threads: int, assistant: Path | None = None) -> None:
        """Make the MTP head: of this file's MTP layers, or of an ``assistant`` file that reads this model's
        memory (:func:`localspec.llama.heads.start_head`); a failure frees the model."""
        try:
            self.mtp, self._mtp_cache_bytes = self._call(
                lambda: heads.start_head(
                    self.model,
                    self.ctx,
                    what=str(self.path),
                    assistant=str(assistant) if assistant else None,
                    n_gpu_layers=self.n_gpu_layers,
                    n_ctx=self.n_ctx,
                    n_batch=self.n_batch,
                    n_threads=n_threads,
                )
            )
        except LocalspecError:
            self.close()
            raise

    def follow_mtp(self, on: bool) -> None:
        """Whether this model's passes feed its MTP head (nothing without one): off, they cost nothing more,
        and the head evaluates what it missed when it drafts again."""
        head = self.mtp
        if head is not None:
            self._call(lambda: head.set_following(on))

    def mtp_bytes(self) -> int:
        """Memory the MTP head adds: its context's KV cache as llama.cpp allocated it (0 without MTP, and for
        an assistant, which reads this model's); its weights are in :attr:`weights_bytes` (an assistant's:
        ``mtp.weights_bytes``)."""
        if self.mtp is None:
            return 0
        if self._mtp_cache_bytes is not None:
            return self._mtp_cache_bytes
        return self._kv_estimate(self.mtp.n_layers)

    def _kv_estimate(self, n_layers: int) -> int:
        """The f16 KV cache of ``n_layers`` attention layers over the whole context, from the header."""
        meta = self.metadata
        arch = meta.get("general.architecture", "")
        n_head = max(1, llama_cpp.llama_model_n_head(self.model))
        n_embd = llama_cpp.llama_model_n_embd(self.model)
        k_len = int(meta.get(f"{arch}.attention.key_length", n_embd // n_head))
        v_len = int(meta.get(f"{arch}.attention.value_length", n_embd // n_head))
        n_head_kv = llama_cpp.llama_model_n_head_kv(self.model)
        return self.n_ctx * len(self.sequences) * n_layers * n_head_kv * (k_len + v_len) * 2

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` where this model's llama.cpp calls run: on the RPC guard's thread for a model with layers
        on rpc-servers, else here (for a part that works on this model's contexts, as its MTP head)."""
        if self._guard is None:
            return fn()
        try:
            return self._guard.call(fn)
        except RpcError:
            if self._guard.broken and self._llama is not None:
                _LOST.append(self._llama)  # never collected: freeing it would talk to the lost server
            raise

    _call = call

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
        """The memory of this model's context (KV cache, a recurrent model's states and snapshots) as its load
        log says; without it (LOCALSPEC_VERBOSE), estimated from its shape, every layer as attention."""
        if self._cache_bytes is not None:
            return self._cache_bytes
        return self._kv_estimate(int(llama_cpp.llama_model_n_layer(self.model)))

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
        """Ids that render as no text and do not end a generation (control tokens), computed once
        (:func:`localspec.llama.token_sets.textless_ids`)."""
        if self._textless is None:
            self._textless = token_sets.textless_ids(self.vocab, self.n_vocab, self.eog_ids)
        return self._textless

    def space_ids(self) -> np.ndarray:
        """Ids whose text is whitespace only, computed once (:func:`localspec.llama.token_sets.space_ids`)."""
        if self._space is None:
            self._space = token_sets.space_ids(self.vocab, self.n_vocab)
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
        tokens (the prompt cache first keeping what goes, and putting back a longer prefix it holds); returns
        the tokens of ``context`` that still need evaluating."""
        seq = seq or self.seq0
        n = seq.common_prefix(context, keep_last)  # (once: this runs every draft round)
        if self.prompt_cache is not None:
            n = self.prompt_cache.before_sync(seq, context, keep_last, n)
        seq.truncate(n)
        return context[n:]

    def decode(self, tokens: list[int], seq: Sequence | None = None) -> None:
        """Evaluate ``tokens`` after the ones ``seq`` (default sequence 0) holds, without any logits rows
        (a prefill).

        Goes in chunks of the real batch, so any length that fits the context is safe.
        """
        seq = seq or self.seq0
        seq.check_room(len(tokens), self.n_ctx)
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
        _check_outputs(self, outputs)
        seq = seq or self.seq0
        seq.check_room(len(tokens), self.n_ctx)
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
            seq.check_room(len(tokens), self.n_ctx)
        if sum(self.batch_width(seq, tokens) for seq, tokens, _ in parts) > self.n_batch:
            raise SettingsError(
                f"{self.path.name}: a pass of {sum(len(t) for _, t, _ in parts)} tokens over "
                f"{len(parts)} sequences exceeds llama.cpp's batch of {self.n_batch}",
                hint="this is a bug in the caller's sizing of the pass: report it",
            )
        _check_outputs(self, sum(outputs for _, _, outputs in parts))
        return self._decode_parts([_Part(seq, seq.take_owed(tokens), out) for seq, tokens, out in parts])

    def batch_width(self, seq: Sequence, tokens: list[int]) -> int:
        """The rows ``tokens`` take in a pass for ``seq``: its owed tokens go in front of them."""
        return seq.owed + len(tokens)

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
