"""Taking rejected draft tokens back out of a recurrent or hybrid model's memory.

A transformer's KV cache drops any suffix of a sequence (``llama_memory_seq_rm``). A recurrent layer (Mamba,
RWKV, Gated DeltaNet, the linear-attention layers of Qwen3.5/3.6, Nemotron-H, LFM2, Granite-4 H...) keeps one
running state per sequence instead, which has no earlier positions to go back to. llama.cpp offers two ways
back, and :class:`~localspec.llama.runtime.Model` uses them as llama-server does:

- **state snapshots** (``llama_context_params.n_rs_seq``): for the architectures llama.cpp marks
  (``llm_arch_supports_rs_rollback``), the context keeps the states of the last ``n_rs_seq`` positions of a
  pass, and ``seq_rm`` of up to that many trailing tokens works as on a transformer. Asked for at load time
  (:func:`snapshots_asked`); llama.cpp sets 0 for an architecture without them.
- **checkpoints**: the sequence's recurrent state copied out before a pass (``llama_state_seq_get_data_ext``
  with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: the recurrent part only, the attention layers' KV cache still
  drops a suffix) and copied back when the tokens after it must go (:class:`Checkpoint`). The tokens that
  were kept after the checkpoint are then evaluated again: the model owes them, and its next pass carries
  them in front of its own tokens (one wider pass, not one more pass: what llama-server's replay does).

Whether a model has recurrent memory is llama.cpp's answer once it is loaded (``llama_model_is_recurrent``,
``llama_model_is_hybrid``); before loading, :mod:`localspec.gguf.vocab` answers from the header's architecture
with lists that a test reads back from the vendored ``src/llama-arch.cpp``.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import llama_cpp
import llama_cpp._internals as llama_internals

from localspec.llama.load_hooks import replaced

#: The most state snapshots a model keeps per sequence: each costs one more copy of the recurrent state in
#: memory, and a draft longer than this goes through a checkpoint.
MAX_SNAPSHOTS = 8
#: Owed tokens a verify pass may carry in front of its own. A checkpoint is copied before the pass, so after
#: another restore they are owed again with the new ones: past this many they are evaluated on their own
#: first (one more pass, as llama-server's replay pays after every restore).
OWED_CARRIED = 2
#: ``llama_state_seq_*_ext`` flag: only the partial state (a recurrent layer's, or an SWA cache's).
PARTIAL_ONLY = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


def memory_kind(model: Any) -> str:
    """``"attention"``, ``"hybrid"`` (attention and recurrent layers) or ``"recurrent"``, from llama.cpp.

    Args:
        model: a loaded ``llama_model`` pointer.

    Returns:
        The kind of memory the model's context keeps.
    """
    if llama_cpp.llama_model_is_recurrent(model):
        return "recurrent"
    if llama_cpp.llama_model_is_hybrid(model):
        return "hybrid"
    return "attention"


@contextlib.contextmanager
def snapshots_asked(depth: int) -> Iterator[None]:
    """While the block loads a model through ``llama_cpp.Llama``, its context asks for ``depth``
    recurrent-state snapshots per sequence when the model has recurrent memory.

    ``Llama`` has no argument for ``n_rs_seq``: the context class it calls is replaced for the block
    (:func:`localspec.llama.load_hooks.replaced`). A model without recurrent memory gets the parameters
    unchanged, and llama.cpp itself sets 0 for an architecture that keeps no snapshots.

    Args:
        depth: snapshots to keep (the longest draft to take back without a checkpoint); 0 asks for none.
    """
    if depth <= 0:
        yield
        return

    def with_snapshots(original: type) -> type:
        class WithSnapshots(original):
            def __init__(self, *, model: Any, params: Any, verbose: bool = True) -> None:
                if memory_kind(model.model) != "attention":
                    params.n_rs_seq = depth
                super().__init__(model=model, params=params, verbose=verbose)

        return WithSnapshots

    with replaced(llama_internals, "LlamaContext", with_snapshots):
        yield


@dataclass
class RollbackStats:
    """What taking tokens back out of a model's recurrent memory cost so far (all zero for a transformer)."""

    saves: int = 0  # checkpoints copied out
    save_seconds: float = 0.0
    restores: int = 0  # checkpoints copied back
    restore_seconds: float = 0.0
    replayed: int = 0  # tokens evaluated again after a restore (in front of a later pass)
    resets: int = 0  # rollbacks no snapshot or checkpoint reached: the sequence evaluated again from 0

    @classmethod
    def total(cls, parts: Iterable[RollbackStats]) -> RollbackStats:
        """Every count and time of ``parts`` summed."""
        out = cls()
        for part in parts:
            for f in fields(cls):
                setattr(out, f.name, getattr(out, f.name) + getattr(part, f.name))
        return out

    @property
    def seconds(self) -> float:
        """Seconds spent copying states out and back (the replayed tokens' share of later passes excluded)."""
        return self.save_seconds + self.restore_seconds


class Checkpoint:
    """One sequence's recurrent state at a token count, copied out of a llama.cpp context (host memory).

    The buffer is kept and reused by later saves of the same size or smaller.

    Args:
        seq_id: the sequence whose state it copies (llama.cpp's sequence id).
    """

    def __init__(self, seq_id: int = 0) -> None:
        self.seq_id = seq_id
        self.n_tokens = -1  # the token count the saved state is at; -1: nothing saved
        self._buf: Any = None
        self._size = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the saved state (0 before the first save)."""
        return self._size

    def save(self, ctx: Any, n_tokens: int, stats: RollbackStats) -> bool:
        """Copy the sequence's recurrent state out of ``ctx``; it stands at ``n_tokens`` tokens.

        Returns:
            False when llama.cpp could not copy it (the checkpoint is then empty).
        """
        t = time.perf_counter()
        size = int(llama_cpp.llama_state_seq_get_size_ext(ctx, self.seq_id, PARTIAL_ONLY))
        if self._buf is None or len(self._buf) < size:
            self._buf = (ctypes.c_uint8 * max(size, 1))()
        got = int(llama_cpp.llama_state_seq_get_data_ext(ctx, self._buf, size, self.seq_id, PARTIAL_ONLY))
        self._size, self.n_tokens = size, n_tokens if got == size and size > 0 else -1
        stats.saves += 1
        stats.save_seconds += time.perf_counter() - t
        return self.n_tokens >= 0

    def restore(self, ctx: Any, stats: RollbackStats) -> bool:
        """Copy the saved state back into its sequence of ``ctx``.

        Returns:
            False when nothing is saved or llama.cpp did not take all of it.
        """
        if self.n_tokens < 0:
            return False
        t = time.perf_counter()
        got = int(
            llama_cpp.llama_state_seq_set_data_ext(ctx, self._buf, self._size, self.seq_id, PARTIAL_ONLY)
        )
        stats.restores += 1
        stats.restore_seconds += time.perf_counter() - t
        if got != self._size:
            self.forget()
            return False
        return True

    def forget(self) -> None:
        """The saved state no longer matches the sequence (tokens before it were removed)."""
        self.n_tokens = -1
