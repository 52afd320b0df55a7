"""What one call of a pipeline runs: its arguments checked, its settings (``auto`` routed for the request),
its drafter and its stats, as a generation ready to run; and, when it is done, what its model drafter
measured told to the router (:class:`CallSetup`, a part of :class:`~localspec.pipeline.pipeline.Pipeline`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localspec.constrain.grammar import Grammar
from localspec.decoding.costs import MachineCosts
from localspec.decoding.drafters import ModelDrafter
from localspec.decoding.engine import Engine, Generation
from localspec.decoding.routing import Route, Router
from localspec.decoding.stats import GenerationStats, MemoryReport
from localspec.errors import ContextOverflowError
from localspec.gguf.pairing import PairInfo
from localspec.llama.runtime import Model
from localspec.llama.sampling import SamplingParams
from localspec.pipeline.checks import checked_grammar_and_length, checked_stop, checked_tokens
from localspec.pipeline.drafting import drafter_for
from localspec.pipeline.models import for_pair
from localspec.settings import TARGET_ALONE, DraftSettings, Strategy
from localspec.suffix.drafter import SuffixDrafter


class CallSetup:
    """The calls' set-up of a pipeline (mixed into :class:`~localspec.pipeline.pipeline.Pipeline`, which
    provides what is declared here)."""

    info: PairInfo
    settings: DraftSettings
    memory: MemoryReport
    router: Router
    route: Route | None
    n_ctx_asked: int | None
    _target: Model
    _draft: Model | None
    _engine: Engine
    _model_drafter: ModelDrafter | None
    machine_costs: Callable[[], MachineCosts]
    suffix_drafter: Callable[[], SuffixDrafter]

    @property
    def n_ctx(self) -> int:
        """The context llama.cpp really gave each sequence (it rounds up what was asked)."""
        return self._target.n_ctx

    @property
    def n_ctx_is_trained(self) -> bool:
        """Whether the context is the model's trained one, so a larger n_ctx would be lowered to it again."""
        trained = self.info.n_ctx_train
        return trained is not None and trained > 0 and self.n_ctx >= trained

    @property
    def max_draft(self) -> int:
        """The longest draft one verify pass can check (see
        :attr:`localspec.llama.runtime.Model.max_draft`)."""
        return self._target.max_draft

    @property
    def placement(self) -> dict[str, str]:
        """Where each loaded model runs, e.g. ``{"target": "CPU", "draft": "GPU (all layers)"}``."""
        out = {"target": self._target.placement}
        if self._draft is not None:
            out["draft"] = self._draft.placement
        return out

    def _route(self, s: DraftSettings, tokens: list[int]) -> tuple[DraftSettings, Route]:
        """``auto``: suffix alone, or a model drafter (adaptive) with the suffix cache, for this request, as
        the :attr:`router` decides from what the loaded drafters measured."""
        r = self.router.route(
            costs=self.machine_costs, n_max=min(s.n_max, 8), overlap=self.suffix_drafter().overlap(tokens)
        )
        adaptive = True if r.strategy.combined else s.adaptive  # a model drafter runs adaptive
        return s.with_overrides(strategy=r.strategy, adaptive=adaptive), r

    def _start(
        self,
        tokens: list[int],
        *,
        max_tokens: int,
        params: SamplingParams,
        stop: list[str] | None,
        strategy: str | Strategy | None,
        baseline: bool,
        grammar: Grammar | None,
        **overrides: Any,
    ) -> Generation:
        """:meth:`start_tokens` with the sampling parameters made."""
        tokens, stop = self._checked_call(tokens, max_tokens, stop, grammar, params)
        settings, chosen = self._call_settings(tokens, strategy, baseline, **overrides)
        return self._engine.start(
            tokens,
            drafter=drafter_for(settings, self._target, self._model_drafter, self.suffix_drafter),
            max_tokens=max_tokens,
            params=params,
            settings=settings,
            stop=stop,
            stats=self._new_stats(settings, chosen),
            grammar=grammar,
        )

    def _checked_call(
        self,
        tokens: list[int],
        max_tokens: int,
        stop: list[str] | None,
        grammar: Grammar | None,
        params: SamplingParams,
    ) -> tuple[list[int], list[str] | None]:
        """A call's arguments checked before its first token: the tokens and stop strings as the engine
        takes them, or the :class:`SettingsError` / :class:`ContextOverflowError` that says what is wrong."""
        checked_grammar_and_length(grammar, max_tokens)
        tokens = checked_tokens(tokens, self._target.n_vocab, self.info.target_path.name)
        stop = checked_stop(stop)
        self.check_fits(len(tokens), max_tokens)
        params.validate()
        return tokens, stop

    def _call_settings(
        self,
        tokens: list[int],
        strategy: str | Strategy | None,
        baseline: bool,
        *,
        n_max: int | None,
        **overrides: Any,
    ) -> tuple[DraftSettings, Route | None]:
        """The settings one call runs: the pipeline's with the call's overrides, and ``auto`` resolved to a
        strategy for this request (with its :class:`Route`; None when a strategy was named)."""
        switched = self.settings.switched_to(
            TARGET_ALONE if baseline else strategy, n_max=n_max, max_draft=self.max_draft, **overrides
        )
        settings = for_pair(self.info, switched)
        if not settings.strategy.routed:
            return settings, None
        settings, chosen = self._route(settings, tokens)
        self.route = chosen
        return settings, chosen

    def _new_stats(self, settings: DraftSettings, chosen: Route | None) -> GenerationStats:
        """The running stats of one generation, before its first token."""
        return GenerationStats(
            strategy=settings.strategy,
            draft_name=self._draft_name(settings),
            pairing_note=self.info.note,
            memory=self.memory,
            placement=self.placement,
            route=chosen,
        )

    def _draft_name(self, settings: DraftSettings) -> str | None:
        """The draft file ``settings`` draft with: the draft model's, or an MTP assistant's."""
        path, assistant = self.info.draft_path, self.info.assistant
        drafts = settings.uses_model or (settings.uses_mtp and assistant)
        return path.name if path is not None and drafts else None

    def check_fits(self, n: int, max_tokens: int) -> None:
        """A prompt of ``n`` tokens plus ``max_tokens`` within the context, else ContextOverflowError."""
        if n + max_tokens > self.n_ctx:
            raise ContextOverflowError.before_generating(
                prompt_tokens=n,
                max_tokens=max_tokens,
                n_ctx=self.n_ctx,
                n_ctx_train=self.info.n_ctx_train,
                at_trained_limit=self.n_ctx_is_trained,
                lowered_from=self.n_ctx_asked or None,
            )

    def _learned(self, gen: Generation) -> None:
        """Tell the :attr:`router` what the model drafter of a generation measured: its drafted and accepted
        tokens, its rounds, and the speed its adaptive controller predicted."""
        record = self.router.record_for(gen.settings.strategy)
        stats = gen.stats
        if record is None or not stats.generated_tokens:
            return
        counts = stats.by_drafter.get(record.source)
        record.record(
            self.router.requests,
            drafted=stats.drafted_by_source.get(record.source, 0),
            accepted=stats.accepted_by_source.get(record.source, 0),
            rounds=counts.rounds if counts else 0,
            speed=stats.predicted_speedup,
        )
