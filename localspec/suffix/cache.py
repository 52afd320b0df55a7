"""The suffix cache of one loaded target: its drafter, the store on disk (unless off) and the corpus.

A :class:`SuffixCache` is what a :class:`localspec.pipeline.pipeline.Pipeline` holds: it makes the
:class:`~localspec.suffix.drafter.SuffixDrafter` at its first use (loading the store, indexing the corpus,
measuring the machine's verify costs), starts it over for benchmarks, and replaces the corpus.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from localspec import constants
from localspec.suffix.calibration import TOKEN_WEIGHT, Cell, TokenCell
from localspec.suffix.corpus import read_corpus
from localspec.suffix.drafter import SuffixDrafter
from localspec.suffix.index import SuffixIndex
from localspec.suffix.store import SuffixStore
from localspec.units import format_bytes

#: Told (a line of text) before a pause: indexing a corpus.
Notify = Callable[[str], None] | None


class Target(Protocol):
    """What the suffix cache needs of the target model (:class:`localspec.llama.runtime.Model`)."""

    @property
    def n_vocab(self) -> int: ...

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]: ...


class SuffixCache:
    """The suffix cache of ``target`` (whose GGUF is ``target_path``): earlier requests, the store on disk
    (``persist``, unless ``LOCALSPEC_NO_STORE`` is set; per vocabulary and ``namespace``), and the text files
    of ``corpus``.

    ``verify_cost`` gives this machine's verify-cost curve V(b); it is asked once, when the drafter is
    first made (it may measure, for seconds).
    """

    def __init__(
        self,
        target: Target,
        target_path: Path,
        *,
        verify_cost: Callable[[], Callable[[int], float]],
        persist: bool = True,
        corpus: Path | None = None,
        namespace: str = "default",
    ) -> None:
        self.target = target
        self.target_path = target_path
        self.verify_cost = verify_cost
        self.persist = persist and not constants.no_store()
        self.corpus = corpus
        self.namespace = namespace
        self.store: SuffixStore | None = None
        self._drafter: SuffixDrafter | None = None

    @property
    def problem(self) -> str | None:
        """Why the store on disk is not being used, or its last save failed; None while it works (or before
        the drafter was first made, or without a store)."""
        return self.store.problem if self.store is not None else None

    def drafter(self, notify: Notify = None) -> SuffixDrafter:
        """The drafter, made at its first use: from the store (unless off), with the corpus indexed."""
        if self._drafter is None:
            from localspec.gguf.meta import read_metadata
            from localspec.gguf.vocab import fingerprint

            # a store is never shared across vocabularies: its file is named by the target's fingerprint
            vocab_id = fingerprint(read_metadata(self.target_path, merges=False)).fingerprint or "none"
            n_vocab = self.target.n_vocab
            if self.persist:
                self.store = SuffixStore(None, vocab_id, namespace=self.namespace, n_vocab=n_vocab)
                index = self.store.load()
            else:
                index = SuffixIndex(n_vocab=n_vocab)
            if self.corpus is not None:
                self._index_corpus(index, self.corpus, notify)
            costs = self.verify_cost()
            # the calibration the last process saved with the store: drafting starts where it left off
            store = self.store
            self._drafter = SuffixDrafter(
                index,
                verify_cost=costs,
                store=store,
                calibration=store.calibration if store is not None else (),
                tokens=store.tokens if store is not None else (),
            )
        return self._drafter

    def reset(
        self,
        state: dict | None = None,
        calibration: Iterable[Cell] = (),
        tokens: Iterable[TokenCell] = (),
        token_weight: float = TOKEN_WEIGHT,
        notify: Notify = None,
    ) -> None:
        """Start over: empty, or from an index :meth:`SuffixIndex.state` snapshot (the corpus is kept), with
        the drafter's calibration and token table learnt afresh or starting from ``calibration`` and
        ``tokens``; ``token_weight`` is the drafter's (0: no token table). The store on disk is not touched
        unless the next request saves."""
        drafter = self.drafter(notify)
        corpus = drafter.index.corpus
        n_vocab = self.target.n_vocab
        index = SuffixIndex.from_state(state, n_vocab=n_vocab) if state else SuffixIndex(n_vocab=n_vocab)
        index.corpus = corpus
        self._drafter = SuffixDrafter(
            index,
            verify_cost=drafter.verify_cost,
            store=drafter.store,
            calibration=calibration,
            tokens=tokens,
            token_weight=token_weight,
        )

    def set_corpus(self, folder: str | os.PathLike, notify: Notify = None) -> None:
        """Draft from the text files of ``folder`` too (replaces the corpus; tokenized now)."""
        self._index_corpus(self.drafter(notify).index, Path(folder).expanduser(), notify)

    def _index_corpus(self, index: SuffixIndex, folder: Path, notify: Notify) -> None:
        """``folder``'s text files as ``index``'s corpus, tokenized by the target; the store (when on)
        names the folder, as ``localspec index`` does (``localspec cache info`` shows it)."""
        scan = read_corpus(folder)
        root = str(scan.root.resolve())
        before = self.store.corpus_root if self.store is not None else None
        if notify is not None:  # a pause of seconds per MB of text, and the store's corpus changes
            replaced = (
                f"; it replaces the corpus from {before} in the store" if before and before != root else ""
            )
            notify(
                f"indexing {len(scan.files):,} files ({format_bytes(scan.n_bytes)}) of {root} as the suffix "
                f"cache's corpus{replaced}"
            )
        tokenize = self.target.tokenize
        index.set_corpus([tokenize(text, add_bos=False, special=False) for _, text in scan.files])
        if self.store is not None:
            self.store.corpus_root = root
