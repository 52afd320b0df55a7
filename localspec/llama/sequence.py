"""One generation's place in a model's context: the tokens its KV cache holds, the ones it owes, and the
copies that take drafts back.

A llama.cpp context holds up to ``n_seq_max`` sequences in one KV cache;
:class:`~localspec.llama.runtime.Model` loads it with ``n_seq`` of them (:func:`sequences_asked`) and keeps
one :class:`Sequence` each. A generation runs on one sequence: its position is the count of tokens the
sequence holds, a rejected draft leaves it through ``llama_memory_seq_rm`` of that sequence alone, and a
recurrent or hybrid model takes drafts back through that sequence's own state snapshots or checkpoints
(:mod:`localspec.llama.recurrent`). One sequence is just ``n_seq = 1``: the same record, the same
operations.

The model keeps what belongs to the weights and the context (loading, batches, decoding); the sequence keeps
what belongs to one generation's cache and the operations on it (append, truncate, restore).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from collections.abc import Sequence as SeqOf
from dataclasses import dataclass
from typing import Any, TypeVar

import llama_cpp
import llama_cpp._internals as llama_internals

from localspec.errors import ContextOverflowError, LocalspecError
from localspec.llama import recurrent
from localspec.llama.load_hooks import replaced

T = TypeVar("T")


@contextlib.contextmanager
def sequences_asked(n_seq: int) -> Iterator[None]:
    """While the block loads a model through ``llama_cpp.Llama``, its context holds ``n_seq`` sequences in one
    unified KV cache (``n_seq_max``, ``kv_unified``).

    Unified: one pass may carry rows of every sequence and llama.cpp computes it as one batch (separate
    streams per sequence would split a mixed pass into equal parts). ``Llama`` has no argument for either;
    the context class it calls is replaced for the block, as for the state snapshots.

    Args:
        n_seq: sequences the context holds (1: llama-cpp-python's own parameters, unchanged).
    """
    if n_seq <= 1:
        yield
        return

    def with_sequences(original: type) -> type:
        class WithSequences(original):
            def __init__(self, *, model: Any, params: Any, verbose: bool = True) -> None:
                params.n_seq_max = n_seq
                params.kv_unified = True
                super().__init__(model=model, params=params, verbose=verbose)

        return WithSequences

    with replaced(llama_internals, "LlamaContext", with_sequences):
        yield


@dataclass(frozen=True)
class ContextHandle:
    """What a sequence needs of its model's context: the llama.cpp pointers, how its memory takes tokens back,
    and where the model's llama.cpp calls run (an RPC-backed model's run on its guard's thread)."""

    ctx: Any  # llama_context pointer
    memory: Any  # llama_memory_t of that context
    memory_kind: str  # "attention", "hybrid" or "recurrent" (recurrent.memory_kind)
    n_rs_seq: int  # recurrent-state snapshots llama.cpp keeps per sequence
    n_seq: int  # sequences the context holds
    name: str  # the model file's name, for errors
    call: Callable[[Callable[[], Any]], Any]  # runs a llama.cpp call where the model's calls run


def common_length(a: SeqOf[int], b: SeqOf[int], limit: int | None = None) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (at most ``limit``)."""
    top = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    n = 0
    while n < top and a[n] == b[n]:
        n += 1
    return n


class Sequence:
    """One sequence of a model's context: what its cache holds, in order (the last :attr:`owed` of them still
    due), and the checkpoints of its recurrent state.

    Args:
        handle: the model's context (:class:`ContextHandle`).
        seq_id: llama.cpp's sequence id (0 to ``n_seq - 1``).
    """

    def __init__(self, handle: ContextHandle, seq_id: int) -> None:
        self.handle = handle
        self.seq_id = seq_id
        #: what the KV cache holds for this sequence, in order (its last :attr:`owed` are still due)
        self.tokens: list[int] = []
        # The last tokens of ``tokens`` that a checkpoint restore took out of llama.cpp's memory: the next
        # decode evaluates them again in front of its own tokens (see :meth:`truncate`).
        self._owed: list[int] = []
        # Copies of the recurrent state: the last one before a pass that may be taken back (a round's), and
        # the one at the end of the last prompt (where the next request on the same prompt comes back to).
        self._round_checkpoint = recurrent.Checkpoint(seq_id)
        self._prefix_checkpoint = recurrent.Checkpoint(seq_id)
        #: what taking this sequence's tokens back cost so far
        self.rollback = recurrent.RollbackStats()

    # Facts ------------------------------------------------------------------------------------
    @property
    def held(self) -> int:
        """Tokens really in llama.cpp's memory: :attr:`tokens` less the owed ones."""
        return len(self.tokens) - len(self._owed)

    @property
    def owed(self) -> int:
        """Tokens the cache holds in name only (after a checkpoint restore): the next decode evaluates them
        first."""
        return len(self._owed)

    def state_bytes(self) -> int:
        """Bytes of this sequence's recurrent state as it stands (0 for a transformer)."""
        h = self.handle
        if h.memory_kind == "attention":
            return 0
        return int(llama_cpp.llama_state_seq_get_size_ext(h.ctx, self.seq_id, recurrent.PARTIAL_ONLY))

    def time_rollback(self) -> tuple[float, float]:
        """Seconds to copy this sequence's recurrent state out and back, timed once now (``(0.0, 0.0)`` for a
        transformer). The sequence is left as it was."""
        h = self.handle
        if h.memory_kind == "attention":
            return 0.0, 0.0
        probe, stats = recurrent.Checkpoint(self.seq_id), recurrent.RollbackStats()
        held = self.held
        h.call(lambda: probe.save(h.ctx, held, stats) and probe.restore(h.ctx, stats))
        return stats.save_seconds, stats.restore_seconds

    # Operations -------------------------------------------------------------------------------
    def needs_checkpoint(self, ahead: int) -> bool:
        """Whether a pass appending up to ``ahead`` tokens that may be taken back needs a checkpoint first:
        never for a transformer, nor when the state snapshots cover ``ahead`` tokens."""
        return self.handle.memory_kind != "attention" and ahead > self.handle.n_rs_seq

    def save_round(self) -> None:
        """Copy the recurrent state out before a pass that may be taken back (unless the copy stands here)."""
        self._save(self._round_checkpoint)

    def mark_prefix(self) -> None:
        """The cached tokens are a prompt later requests may start with again: keep the recurrent state here
        (nothing for a transformer, whose cache drops any suffix)."""
        if self.handle.memory_kind != "attention":
            self._save(self._prefix_checkpoint)

    def _save(self, checkpoint: recurrent.Checkpoint) -> None:
        h, held = self.handle, self.held
        if checkpoint.n_tokens != held:
            h.call(lambda: checkpoint.save(h.ctx, held, self.rollback))

    def appended(self, tokens: list[int]) -> None:
        """llama.cpp evaluated ``tokens`` after the held ones."""
        self.tokens.extend(tokens)

    def take_owed(self, tokens: list[int]) -> list[int]:
        """``tokens`` with the owed ones in front (no longer counted as held), for the decode about to run."""
        if not self._owed:
            return tokens
        owed, self._owed = self._owed, []
        del self.tokens[len(self.tokens) - len(owed) :]
        self.rollback.replayed += len(owed)
        return owed + tokens

    def common_prefix(self, context: list[int], keep_last: int = 0) -> int:
        """How many leading tokens of ``context`` (less its last ``keep_last``) this sequence holds."""
        return common_length(self.tokens, context, len(context) - keep_last)

    def sync(self, context: list[int], keep_last: int = 0) -> list[int]:
        """Trim to the longest common prefix with ``context`` minus its last ``keep_last`` tokens.

        Returns:
            The tokens of ``context`` that still need evaluating.
        """
        n = self.common_prefix(context, keep_last)
        self.truncate(n)
        return context[n:]

    def check_room(self, n: int, n_ctx: int) -> None:
        """Refuse ``n`` more tokens past a room of ``n_ctx`` with a :class:`ContextOverflowError`."""
        if len(self.tokens) + n > n_ctx:
            raise ContextOverflowError(
                f"{self.handle.name}: {len(self.tokens) + n} tokens do not fit the context of {n_ctx}",
                hint="use a shorter prompt, a smaller max_tokens, or a larger n_ctx",
            )

    def truncate(self, n: int) -> None:
        """Forget every cached token from position ``n`` on.

        A transformer drops them (``seq_rm``), and so does a recurrent model within its state snapshots.
        Past them, the latest checkpoint at or before ``n`` (a round's, or the last prompt's) is copied back
        and the tokens between it and ``n`` are owed: the next decode evaluates them first. With no such
        checkpoint the sequence starts over and every kept token is owed (correct, and as slow as a new
        prompt).
        """
        if n >= len(self.tokens):
            return
        held, h = self.held, self.handle
        if n >= held:  # only owed tokens go
            del self._owed[n - held :]
            del self.tokens[n:]
            return
        self._owed = []  # every owed token stood past n
        for checkpoint in (self._round_checkpoint, self._prefix_checkpoint):
            if checkpoint.n_tokens > n:
                checkpoint.forget()
        if h.call(lambda: llama_cpp.llama_memory_seq_rm(h.memory, self.seq_id, n, -1)):
            del self.tokens[n:]
            return
        if h.memory_kind == "attention":
            raise LocalspecError(
                f"{h.name}: llama.cpp cannot roll back part of this model's memory",
                hint="report it with the model's architecture: its memory type is not one localspec knows",
            )
        at = h.call(lambda: self._restore(n))
        self._owed = self.tokens[at:n]
        del self.tokens[n:]

    def _restore(self, n: int) -> int:
        """Back at the latest checkpoint (every one left is at or before ``n``), or empty.

        Returns:
            The token count the sequence now holds.
        """
        h = self.handle
        latest = max(self._round_checkpoint, self._prefix_checkpoint, key=lambda c: c.n_tokens)
        at = latest.n_tokens
        # the attention layers' KV cache past the checkpoint goes as on a transformer
        if at >= 0 and latest.restore(h.ctx, self.rollback):
            if llama_cpp.llama_memory_seq_rm(h.memory, self.seq_id, at, -1):
                return at
        self.forget_checkpoints()
        self._clear()
        self.rollback.resets += n > 0
        return 0

    def clear(self) -> None:
        """Empty this sequence: nothing held, nothing owed, no checkpoint."""
        self.forget_checkpoints()
        self.handle.call(self._clear)
        self.tokens, self._owed = [], []

    def _clear(self) -> None:
        """Empty this sequence in llama.cpp's memory (the whole context only when it holds no other)."""
        h = self.handle
        if not llama_cpp.llama_memory_seq_rm(h.memory, self.seq_id, -1, -1):
            if h.n_seq > 1:
                raise LocalspecError(
                    f"{h.name}: llama.cpp could not empty sequence {self.seq_id} of its memory",
                    hint="load it with one sequence (parallel 1) and report the model's architecture",
                )
            llama_cpp.llama_memory_clear(h.memory, True)

    def failed_decode(self) -> None:
        """A decode failed and may have left part of its batch in memory: remove it, keep the bookkeeping true
        (recurrent memory cannot drop it: the sequence starts over, every token owed)."""
        h = self.handle
        if not llama_cpp.llama_memory_seq_rm(h.memory, self.seq_id, len(self.tokens), -1):
            self.forget_checkpoints()
            self._clear()
            self._owed = list(self.tokens)

    def forget_checkpoints(self) -> None:
        """Neither checkpoint matches the sequence any more."""
        self._round_checkpoint.forget()
        self._prefix_checkpoint.forget()
