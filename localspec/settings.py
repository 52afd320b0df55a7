"""How drafting runs, declared once: the strategies, their bounds, and one frozen settings type.

The API (``load``/``generate``), presets, the bench, the CLI's choices and the UI's radios all take
their strategy names and limits from here, so a new strategy or a changed bound lands in one place.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from localspec.errors import SettingsError


@dataclass(frozen=True)
class Strategy:
    """What one strategy name runs, parsed once here (as llama.cpp's draft types: an enum and a name map,
    :data:`STRATEGY_BY_NAME`); nothing else reads the parts out of a name. The parsed record travels: in
    :class:`DraftSettings`, to the engine, in ``auto``'s route, the stats and the reports (``name`` where it
    is written out); code asks its parts, never compares names (tests/test_strategy_names.py).

    ``none`` is the target alone (the baseline); every other one drafts. ``mtp`` drafts with the target's own
    MTP layers (a file that has them: :mod:`localspec.llama.mtp`), as ``model`` does with a draft model, alone
    or after a lookup (``mtp+ngram``, ``mtp+suffix``). ``ngram`` looks up the current
    prompt and output only; ``suffix`` also remembers earlier requests (and a persisted store and an
    indexed corpus) and sizes each draft from its confidence and this machine's verify cost; ``auto`` picks
    per request between ``suffix`` and a model drafter with it (``model+suffix``, ``mtp+suffix``) from the
    measured costs and what each drafter measured (see :mod:`localspec.decoding.routing`).
    """

    name: str
    model: bool = False  # a draft model drafts (``auto`` decides per request: see ``routed``)
    mtp: bool = False  # the target's MTP layers draft
    lookup: Literal["ngram", "suffix"] | None = None  # where lookup drafts come from, if any
    routed: bool = False  # ``auto``: the router picks the drafters per request

    @property
    def drafts(self) -> bool:
        """Anything but the target alone."""
        return self.model or self.mtp or self.lookup is not None

    @property
    def combined(self) -> bool:
        """A model (a draft model or the MTP layers) and lookups in one drafter (``model+ngram``,
        ``mtp+suffix``...)."""
        return (self.model or self.mtp) and self.lookup is not None

    @property
    def may_use_model(self) -> bool:
        """A loaded draft model may run: the model strategies, and ``auto`` when it pays."""
        return self.model or self.routed

    @property
    def mtp_counterpart(self) -> Strategy:
        """The strategy that drafts as this one does with the MTP layers in place of the draft model
        (``model`` -> ``mtp``, ``model+suffix`` -> ``mtp+suffix``): what a draft model strategy runs when the
        draft is an MTP assistant. Any other strategy is its own counterpart."""
        if not self.model:
            return self
        return _find(mtp=True, lookup=self.lookup)

    @property
    def sizes_own_drafts(self) -> bool:
        """The suffix cache drafts (alone, with a model, or for ``auto``): it sizes each draft from its
        confidence and the verify curve, so ``n_max`` only bounds one verify pass (:func:`lookup_n_max`)."""
        return self.lookup == "suffix"

    def __str__(self) -> str:
        return self.name


def _find(*, model: bool = False, mtp: bool = False, lookup: str | None = None) -> Strategy:
    """The one named strategy made of these parts (never ``auto``)."""
    return next(
        s
        for s in STRATEGY_BY_NAME.values()
        if (s.model, s.mtp, s.lookup, s.routed) == (model, mtp, lookup, False)
    )


#: Every drafting strategy by its name, in the order choices are shown.
STRATEGY_BY_NAME: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("auto", lookup="suffix", routed=True),
        Strategy("model", model=True),
        Strategy("ngram", lookup="ngram"),
        Strategy("suffix", lookup="suffix"),
        Strategy("model+ngram", model=True, lookup="ngram"),
        Strategy("model+suffix", model=True, lookup="suffix"),
        Strategy("mtp", mtp=True),
        Strategy("mtp+ngram", mtp=True, lookup="ngram"),
        Strategy("mtp+suffix", mtp=True, lookup="suffix"),
        Strategy("none"),
    )
}
#: Every strategy name, in the order choices are shown.
STRATEGIES: tuple[str, ...] = tuple(STRATEGY_BY_NAME)
#: The strategies that draft (everything but the target alone).
SPECULATIVE_STRATEGIES: tuple[str, ...] = tuple(n for n, s in STRATEGY_BY_NAME.items() if s.drafts)
#: The strategies that need a draft model loaded.
MODEL_STRATEGIES: tuple[str, ...] = tuple(n for n, s in STRATEGY_BY_NAME.items() if s.model)
#: The strategies whose drafter is a model, a draft model or the MTP layers: what it costs is draft memory.
MODEL_DRAFTER_STRATEGIES: tuple[str, ...] = tuple(n for n, s in STRATEGY_BY_NAME.items() if s.model or s.mtp)
#: The strategies that draft with the target's MTP layers (loaded with the target for them).
MTP_STRATEGIES: tuple[str, ...] = tuple(n for n, s in STRATEGY_BY_NAME.items() if s.mtp)
#: What a bench sweeps by default for a pair: every drafting strategy but the MTP ones (a file with MTP layers
#: is swept with ``--strategy mtp,...`` named).
PAIR_STRATEGIES: tuple[str, ...] = tuple(n for n in SPECULATIVE_STRATEGIES if n not in MTP_STRATEGIES)
#: The strategies whose lookups come from the suffix cache (``auto`` always uses it), ``auto`` last.
SUFFIX_STRATEGIES: tuple[str, ...] = tuple(
    sorted((n for n, s in STRATEGY_BY_NAME.items() if s.lookup == "suffix"), key=lambda n: n == "auto")
)


#: The strategies the router and the pipeline name in code (every other one is parsed from its name).
AUTO = STRATEGY_BY_NAME["auto"]
#: The target alone: the baseline.
TARGET_ALONE = STRATEGY_BY_NAME["none"]
#: The suffix cache's lookups alone: what ``auto`` runs when no model drafter pays.
LOOKUPS_ONLY = STRATEGY_BY_NAME["suffix"]
#: A draft model, or the target's MTP layers, with the suffix cache's lookups: what ``auto`` runs where it
#: pays.
MODEL_WITH_LOOKUPS = STRATEGY_BY_NAME["model+suffix"]
MTP_WITH_LOOKUPS = STRATEGY_BY_NAME["mtp+suffix"]
#: A draft model alone: what a pair with a draft model runs when nothing else is asked.
DRAFT_MODEL = STRATEGY_BY_NAME["model"]
#: Prompt lookup alone (no model, no memory of earlier requests).
PROMPT_LOOKUP = STRATEGY_BY_NAME["ngram"]
#: The words ``--draft`` (and ``load(draft=...)``) takes in place of a file: drafting without a draft model.
DRAFT_WORDS: dict[str, Strategy] = {s.name: s for s in (TARGET_ALONE, PROMPT_LOOKUP)}


def parse_strategy(name: str | Strategy) -> Strategy:
    """The parsed strategy ``name`` names (a :class:`Strategy` is its own), or a :class:`SettingsError`
    listing the names."""
    if isinstance(name, Strategy):
        return name
    found = STRATEGY_BY_NAME.get(name) if isinstance(name, str) else None
    if found is None:
        raise SettingsError(
            f"strategy {name!r} is not one of {', '.join(STRATEGIES)}",
            hint='use "model" for a draft model, "ngram" for prompt lookup, "none" for the target alone',
        )
    return found


#: The longest draft a suffix-cache strategy may propose when no ``n_max`` was asked for: it sizes each
#: draft itself (confidence and the verify curve), so the cap is only a bound on one verify pass.
LOOKUP_N_MAX = 32

#: Bounds of each numeric setting, inclusive: (lowest, highest).
N_MAX_RANGE = (1, 64)
P_MIN_RANGE = (0.0, 1.0)
#: The most settings one ``bench --tune`` sweep may measure per prompt. The default grid with a draft model is
#: 96 and the whole ``n_max`` range at three p_min values 768; past this a sweep takes hours per prompt on a
#: CPU, which is a typo ("1-64" for "1-6") more often than a plan.
MAX_TUNE_SWEEP = 1024
#: Context sizes (tokens) accepted before a model loads; the model's own trained context may allow less.
N_CTX_RANGE = (16, 1 << 20)
#: CPU threads per model: llama.cpp's own ceiling is GGML_MAX_N_THREADS (512); more crashes it.
THREADS_RANGE = (1, 512)
#: Runs of each side per prompt in a comparison or a benchmark (``Pipeline.compare``, ``bench --repeats``).
REPEATS_RANGE = (1, 100)


def max_threads() -> int:
    """The most CPU threads a model may use on this machine: four per logical core (more only slows
    llama.cpp down), and never past llama.cpp's own ceiling."""
    return min(THREADS_RANGE[1], 4 * (os.cpu_count() or 1))


@dataclass(frozen=True, init=False)
class DraftSettings:
    """One drafting setting: which drafter, how long its drafts may be, when it stops, adaptive or not.

    ``strategy`` is parsed once, here: it is given as a name or a :class:`Strategy` and kept as the
    :class:`Strategy`, which travels to the engine, the router, the stats and the reports.
    ``n_max`` is the longest draft per round; the runtime also caps it at the longest draft llama.cpp can
    verify in one pass (see :attr:`localspec.llama.runtime.Model.max_draft`). ``n_min`` drafts at least that
    many tokens before ``p_min`` (the draft model's top probability cut-off) may stop it. ``adaptive`` picks
    each round's length (zero included) from measured acceptance and costs.
    """

    strategy: Strategy
    n_max: int
    n_min: int
    p_min: float
    adaptive: bool

    def __init__(
        self,
        strategy: str | Strategy = "model",
        n_max: int = 4,
        n_min: int = 0,
        p_min: float = 0.75,
        adaptive: bool = False,
    ) -> None:
        object.__setattr__(self, "strategy", parse_strategy(strategy))  # or the error that lists the names
        object.__setattr__(self, "n_max", n_max)
        object.__setattr__(self, "n_min", n_min)
        object.__setattr__(self, "p_min", p_min)
        object.__setattr__(self, "adaptive", adaptive)
        self._check()

    def _check(self) -> None:
        for name in ("n_max", "n_min"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SettingsError(f"{name} must be a whole number, got {value!r}", hint=f"e.g. {name}=4")
        if not isinstance(self.adaptive, bool):
            raise SettingsError(f"adaptive must be true or false, got {self.adaptive!r}")
        lo, hi = N_MAX_RANGE
        if not lo <= self.n_max <= hi:
            raise SettingsError(
                f"n_max {self.n_max} is out of range", hint=f"use a value from {lo} to {hi} (4-16 is usual)"
            )
        if not 0 <= self.n_min <= self.n_max:
            raise SettingsError(
                f"n_min {self.n_min} must be between 0 and n_max ({self.n_max})", hint="lower n_min"
            )
        p = self.p_min
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p):
            raise SettingsError(
                f"p_min must be a number between 0 and 1, got {p!r}", hint="0.75 is a good start"
            )
        if not P_MIN_RANGE[0] <= p <= P_MIN_RANGE[1]:
            raise SettingsError(f"p_min {p} must be between 0 and 1", hint="0.75 is a good start")
        object.__setattr__(self, "p_min", float(p))

    @property
    def is_speculative(self) -> bool:
        """True unless this is the target alone."""
        return self.strategy.drafts

    @property
    def uses_model(self) -> bool:
        """True when this strategy needs a draft model (``auto`` uses one only when it is loaded)."""
        return self.strategy.model

    @property
    def uses_mtp(self) -> bool:
        """True when the target's MTP layers draft."""
        return self.strategy.mtp

    @property
    def may_use_model(self) -> bool:
        """True when a loaded draft model may run: the model strategies, and ``auto`` when it pays."""
        return self.strategy.may_use_model

    @property
    def uses_suffix(self) -> bool:
        """True when this strategy drafts from the suffix cache."""
        return self.strategy.sizes_own_drafts

    def with_overrides(self, **values: Any) -> DraftSettings:
        """A copy with every value that is not None replaced (validated again; a strategy may be a name)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SettingsError(
                f"unknown draft setting(s) {', '.join(unknown)}", hint=f"known: {', '.join(sorted(known))}"
            )
        given = {k: v for k, v in values.items() if v is not None}
        return replace(self, **given) if given else self

    def switched_to(
        self,
        strategy: str | Strategy | None,
        *,
        n_max: int | None = None,
        max_draft: int = LOOKUP_N_MAX,
        **values: Any,
    ) -> DraftSettings:
        """These settings with ``strategy`` (None: the same) and the other values that are not None.

        The one rule for the suffix cache's draft length: it sizes its own drafts, so a switch to a strategy
        that uses it from one that does not, with no ``n_max`` asked for, runs with :data:`LOOKUP_N_MAX`
        (at most ``max_draft``, the longest draft one verify pass of the loaded target checks) as a bound on
        one pass; a switch between suffix strategies keeps the ``n_max`` these settings have.

        Args:
            strategy: the strategy to run, a name or a :class:`Strategy` (None: these settings' one).
            n_max: the longest draft asked for (None: by the rule above).
            max_draft: the longest draft the loaded target can verify in one pass.
            **values: other settings to replace (``n_min``, ``p_min``, ``adaptive``; None keeps them).

        Returns:
            The new settings, validated.
        """
        if strategy is not None and n_max is None and not self.uses_suffix:
            if parse_strategy(strategy).sizes_own_drafts:
                n_max = min(LOOKUP_N_MAX, max_draft)
        return self.with_overrides(strategy=strategy, n_max=n_max, **values)

    @property
    def label(self) -> str:
        """A short human label: ``model k=4 p_min=0.75 adaptive``; ``none`` for the target alone."""
        if not self.is_speculative:
            return "none"
        parts = [self.strategy.name, f"k={self.n_max}"]
        if self.uses_model or self.uses_mtp:
            parts.append(f"p_min={self.p_min:g}")
        if self.adaptive:
            parts.append("adaptive")
        return " ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """The settings as JSON takes them (the strategy by its name)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["strategy"] = self.strategy.name
        return d


#: The target alone: the baseline every speedup is measured against.
BASELINE = DraftSettings(strategy="none")


# Text arguments -----------------------------------------------------------------------------------------
#: What to do about text :func:`utf8_problem` refuses.
UTF8_HINT = "save or convert it as UTF-8 (e.g. iconv -t UTF-8), or decode it with errors='replace'"


def utf8_problem(text: str) -> str | None:
    """Why ``text`` cannot go to llama.cpp's tokenizer (which takes UTF-8), or None. Python holds bytes
    that are not UTF-8, in a command-line argument or a file read as text, as lone surrogates; JSON's
    ``\\ud800`` escapes make them too. Encoding them fails deep inside a generation otherwise."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
        return f"is not valid UTF-8 text: {what} at character {exc.start}"
    return None
