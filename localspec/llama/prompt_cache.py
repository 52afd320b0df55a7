"""A prompt cache in host memory: the KV state of a sequence that a new request is about to overwrite, kept
for a later request that starts the same way (llama-server's ``--cache-ram``).

A model holds a few sequences (``parallel``); a server sees more prompts than that. A chat's next turn, an
agent's next call with its long system prompt, or a client's request after a run of others would otherwise
evaluate its whole prompt again once its sequence went to another request. So when a sequence is made to
hold another context (:meth:`~localspec.llama.runtime.Model.sync`) and would drop at least
:data:`MIN_TOKENS` of what it holds, those tokens' state is copied out first (``llama_state_seq_get_data``);
and when a request's context starts with more of a cached entry than its sequence holds, the entry is copied
in instead (``llama_state_seq_set_data``) and only the rest is evaluated.

- A transformer's entry serves any context that shares a prefix with it (the tail past the shared part is
  dropped after the copy). A recurrent or hybrid model's state cannot go back, so its entry serves only a
  context that starts with all of it.
- Entries are kept within a budget of bytes (and :data:`MAX_ENTRIES`), least recently used first out; an
  entry whose tokens start another's is dropped for the longer one (a transformer's).
- The state read back is the state written: the tokens evaluated from it are the ones a fresh evaluation
  would continue with, up to llama.cpp's batch-split differences (a prompt's rows depend on how its context
  was split into passes, as they do without the cache).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import Any

import llama_cpp

from localspec.llama.sequence import Sequence, common_length

#: A held state shorter than this is not kept, nor copied back for fewer tokens than this: a few tokens cost
#: little to evaluate again (a 27-token prompt took 0.3 s on a 2-core CPU; its copy, a millisecond).
MIN_TOKENS = 8
#: The most states kept (each request looks through them all).
MAX_ENTRIES = 256


@dataclass
class PromptCacheStats:
    """What a prompt cache did: states kept, states copied back (and the tokens that spared), entries
    dropped for room, and the seconds the copies took."""

    saved: int = 0
    restored: int = 0
    restored_tokens: int = 0
    evicted: int = 0
    seconds: float = 0.0


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    buf: Any  # ctypes buffer of ``size`` bytes
    size: int
    used: int  # the cache's clock when it was saved or last copied back


@dataclass
class PromptCache:
    """The prompt cache of one model's context (see the module docstring).

    Args:
        budget: the most bytes its entries may hold together (0: nothing is kept).
    """

    budget: int
    entries: list[_Entry] = field(default_factory=list)
    stats: PromptCacheStats = field(default_factory=PromptCacheStats)
    _clock: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes its entries hold now."""
        return sum(e.size for e in self.entries)

    def before_sync(self, seq: Sequence, context: list[int], keep_last: int, own: int) -> int:
        """Before ``seq`` is trimmed to ``context`` (less its last ``keep_last`` tokens): keep what the trim
        would drop, and copy in the entry that holds more of ``context`` than ``seq`` does.

        Args:
            seq: the sequence about to be synced.
            context: the tokens it is to hold.
            keep_last: the last tokens of ``context`` the caller evaluates itself.
            own: how many leading tokens of ``context`` ``seq`` holds (:meth:`Sequence.common_prefix`).

        Returns:
            How many leading tokens of ``context`` ``seq`` holds now (``own``, or more when an entry came
            back).
        """
        limit = len(context) - keep_last
        if limit - own < MIN_TOKENS and seq.held - own < MIN_TOKENS:
            return own  # (a draft round's sync: little to drop, little to gain)
        whole = seq.handle.memory_kind != "attention"
        best, reach = self._best(context[: max(0, limit)], whole=whole)
        if seq.held - own >= MIN_TOKENS and not seq.owed:
            self._save(seq)
        if best is not None and reach >= own + MIN_TOKENS:
            return reach if self._restore(seq, best, reach) else 0
        return own

    def _best(self, context: list[int], *, whole: bool) -> tuple[_Entry | None, int]:
        """The entry that holds the longest prefix of ``context``, and how long (with ``whole``: an entry
        counts only when all of it is a prefix)."""
        best, reach = None, 0
        for e in self.entries:
            n = common_length(e.tokens, context)
            if whole and n < len(e.tokens):
                continue
            if n > reach:
                best, reach = e, n
        return best, reach

    def _save(self, seq: Sequence) -> None:
        """Copy out the state of ``seq``'s held tokens (unless an entry holds them already), within the
        budget."""
        tokens = tuple(seq.tokens[: seq.held])
        attention = seq.handle.memory_kind == "attention"
        for e in self.entries:
            if e.tokens == tokens or (attention and e.tokens[: len(tokens)] == tokens):
                e.used = self._tick()
                return  # held already (a transformer's longer entry serves this prefix too)
        h, t = seq.handle, time.perf_counter()
        size = int(h.call(lambda: llama_cpp.llama_state_seq_get_size(h.ctx, seq.seq_id)))
        if size <= 0 or size > self.budget:
            return
        buf = (ctypes.c_uint8 * size)()
        got = int(h.call(lambda: llama_cpp.llama_state_seq_get_data(h.ctx, buf, size, seq.seq_id)))
        self.stats.seconds += time.perf_counter() - t
        if got != size:
            return
        if attention:  # a shorter entry this one starts with serves nothing this one does not
            self.entries = [e for e in self.entries if tokens[: len(e.tokens)] != e.tokens]
        self._make_room(size)
        self.entries.append(_Entry(tokens, buf, size, self._tick()))
        self.stats.saved += 1

    def _make_room(self, size: int) -> None:
        while self.entries and (self.nbytes + size > self.budget or len(self.entries) >= MAX_ENTRIES):
            self.entries.remove(min(self.entries, key=lambda e: e.used))
            self.stats.evicted += 1

    def _restore(self, seq: Sequence, entry: _Entry, reach: int) -> bool:
        """Put ``entry``'s state in ``seq`` in place of what it holds, trimmed to ``reach`` tokens; when
        llama.cpp does not take it (no room in one piece), ``seq`` is left empty: its context is evaluated
        again, as without the cache."""
        h, t = seq.handle, time.perf_counter()
        seq.clear()
        put = llama_cpp.llama_state_seq_set_data
        got = int(h.call(lambda: put(h.ctx, entry.buf, entry.size, seq.seq_id)))
        self.stats.seconds += time.perf_counter() - t
        if got != entry.size:
            seq.clear()
            return False
        seq.appended(list(entry.tokens))
        seq.truncate(reach)
        entry.used = self._tick()
        self.stats.restored += 1
        self.stats.restored_tokens += reach
        return True

    def _tick(self) -> int:
        self._clock += 1
        return self._clock
