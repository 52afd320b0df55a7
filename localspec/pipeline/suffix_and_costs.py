"""A pipeline's suffix cache and this machine's measured costs for its models (:class:`SuffixAndCosts`, a part
of :class:`~localspec.pipeline.pipeline.Pipeline`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from localspec.decoding.costs import MachineCosts, machine_costs, stored_costs
from localspec.decoding.engine import Engine
from localspec.llama.runtime import Model
from localspec.pipeline.models import LoadFacts
from localspec.settings import DraftSettings, Strategy, parse_strategy
from localspec.suffix.cache import SuffixCache
from localspec.suffix.calibration import TOKEN_WEIGHT, Cell, TokenCell
from localspec.suffix.drafter import SuffixDrafter


class SuffixAndCosts:
    """The suffix cache's and the machine costs' calls of a pipeline (mixed into
    :class:`~localspec.pipeline.pipeline.Pipeline`, which provides what is declared here)."""

    settings: DraftSettings
    load_facts: LoadFacts
    notify: Callable[[str], None] | None
    _costs: MachineCosts | None
    _target: Model
    _draft: Model | None
    _engine: Engine
    _suffix: SuffixCache

    def machine_costs(self) -> MachineCosts:
        """This machine's measured verify curve V(b) and token costs for these models (measured once per
        machine, build, model files, threads and offload, then read from the cache)."""
        if self._costs is None:
            facts = self.load_facts
            self._costs = machine_costs(
                self._target,
                self._draft,
                threads=facts.threads,
                gpu_layers=facts.gpu_layers,
                draft_gpu_layers=facts.draft_gpu_layers,
                notify=self.notify,
            )
        return self._costs

    def costs_pending(self, strategy: str | Strategy | None = None) -> bool:
        """True when a generation with ``strategy`` (default: the pipeline's) will first measure this
        machine's costs (:meth:`machine_costs`, which takes seconds on a CPU): the suffix
        cache and ``auto`` need them, and they are neither loaded nor stored yet. A caller that shows
        progress (the web UI) says so and calls :meth:`machine_costs` itself first."""
        kind = self.settings.strategy if strategy is None else parse_strategy(strategy)
        if not kind.sizes_own_drafts or self._costs is not None:
            return False
        f = self.load_facts
        found = stored_costs(
            self._target,
            self._draft,
            threads=f.threads,
            gpu_layers=f.gpu_layers,
            draft_gpu_layers=f.draft_gpu_layers,
        )
        return found is None

    def _verify_cost(self) -> Callable[[int], float]:
        """This machine's verify-cost curve V(b), for the suffix cache (measuring uses the target's cache)."""
        with self._engine.lock:
            return self.machine_costs().V

    @property
    def store_problem(self) -> str | None:
        """Why the suffix store on disk is not being used, or its last save failed; None while it works
        (or before the suffix cache first ran, or with ``suffix_store=False``)."""
        return self._suffix.problem

    def suffix_drafter(self) -> SuffixDrafter:
        """The pipeline's suffix cache: earlier requests, the store on disk (unless off), the corpus."""
        return self._suffix.drafter(self.notify)

    def reset_suffix(
        self,
        state: dict | None = None,
        calibration: Iterable[Cell] = (),
        tokens: Iterable[TokenCell] = (),
        token_weight: float = TOKEN_WEIGHT,
    ) -> None:
        """Start the suffix cache over: empty, or from an index :meth:`SuffixIndex.state` snapshot (the
        corpus is kept), with the drafter's calibration and token table learnt afresh or starting from
        ``calibration`` and ``tokens`` (what a store keeps: :meth:`SuffixDrafter.carried_calibration`,
        :meth:`SuffixDrafter.carried_tokens`); ``token_weight`` is the drafter's (0: no token table).
        For benchmarks; the store on disk is not touched unless the next request saves."""
        self._suffix.reset(state, calibration, tokens, token_weight, notify=self.notify)

    def set_corpus(self, folder: str | os.PathLike) -> None:
        """Draft from the text files of ``folder`` too (replaces the corpus; tokenized now)."""
        self._suffix.set_corpus(folder, notify=self.notify)
