"""The ``"auto"`` strategy: per request, which drafters are worth running on this machine.

Lookup drafting (the suffix cache: the prompt, earlier requests, the corpus) costs microseconds a
round and sizes each draft from its confidence and the machine's verify curve, so a round with nothing
worth proposing is a plain target step: it is always on. The draft model costs real time per token
(``c/T`` of a target token) whether or not its tokens are accepted, so it runs only when the measured
costs say it can pay: when some draft length ``k`` gives more expected tokens per unit of time than the
target alone, with acceptance ``a`` per token (what this pipeline measured so far, else a prior), in the
one model of speed (:mod:`localspec.decoding.speed`):

    speed(k) = (1 - a^(k+1)) / (1 - a)  /  (k * c/T + V(k + 1) + R(k))

``R(k)``: a recurrent target's rollback per round (0 for a transformer).

Once the draft model has run, what its adaptive controller measured replaces that formula: the speed
it predicts from acceptance per draft position, the draft calls and verify widths its rounds really
took, and their measured seconds (``measured_speed``), which the engine reports with each result.

Without a draft model, the target's MTP layers (when the file has them) take its place: they run until their
adaptive controller has measured them, then as it measured (their costs are not in the machine's measured
costs). With both, the draft model goes first, then the MTP layers run once to be measured, and from then on
the one whose measured speed is higher is weighed as above (:func:`pick_drafter`).

A request that looks like earlier ones (a high overlap of its prompt with the store) leans on lookups
anyway: the model then only fills rounds where lookup finds nothing, and the adaptive controller keeps
it out of rounds where it does not pay. The decision and its reason are reported with the results.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.decoding import speed
from localspec.decoding.costs import MachineCosts

#: Acceptance per token assumed for a draft model before any is measured (same-family drafts at
#: greedy decoding measured 0.7-0.95 on the Qwen pair).
PRIOR_ACCEPTANCE = 0.8
#: The model must promise at least this speedup over the target alone to be worth its memory and risk.
MIN_GAIN = 1.05


@dataclass(frozen=True)
class Route:
    strategy: str  # "suffix", "model+suffix", "mtp+suffix" or "none"
    reason: str
    model_speed: float | None = None  # the best expected speed of model drafting, in target-alone units

    @property
    def label(self) -> str:
        """What ``auto`` chose, without the reason: ``auto -> suffix``."""
        return f"auto -> {self.strategy}"

    def __str__(self) -> str:
        return f"{self.label}: {self.reason}"


def model_speed(costs: MachineCosts, acceptance: float, n_max: int) -> tuple[float, int]:
    """The best expected speed of draft-model drafting (target alone = 1.0) and the length that gives it
    (0 and 1.0 when no length beats the target alone): :func:`localspec.decoding.speed.best_length` on the
    measured verify curve and rollback cost, at i.i.d. acceptance ``acceptance``."""
    ratio = costs.draft_ratio
    if ratio is None:
        return 0.0, 0
    a = min(max(acceptance, 0.0), 0.999)
    k, best = speed.best_length(
        speed.iid_reach(a, max(1, n_max)),
        max(1, n_max),
        draft=ratio,
        verify=costs.V,
        rollback=lambda k: costs.rollback_passes(k, a),
        k_min=0,
    )
    return best, k


def pick_drafter(speeds: dict[str, float | None]) -> tuple[str, str]:
    """Which of the loaded drafters ``auto`` weighs for a request, and why.

    Args:
        speeds: per drafter (``"model"``, ``"mtp"``; in the order they are tried), the speed its adaptive
            controller measured on earlier requests (None: not measured yet).

    Returns:
        The first drafter not measured yet, else the one measured fastest; and a note on the others.
    """
    names = list(speeds)
    unmeasured = [n for n in names if speeds[n] is None]
    chosen = unmeasured[0] if unmeasured else max(names, key=lambda n: speeds[n] or 0.0)
    others = [
        f"{_NAMES[o]} {'not measured yet' if speeds[o] is None else f'at {speeds[o]:.2f}x'}"
        for o in names
        if o != chosen
    ]
    return chosen, "; ".join(others)


_NAMES = {"model": "the draft model", "mtp": "the MTP layers"}


def _by_measured_speed(speed: float, where: str, with_lookups: str) -> Route:
    """The decision from the speed a drafter's adaptive controller measured on earlier requests."""
    if speed >= MIN_GAIN:
        return Route(
            with_lookups, f"{where}drafting as measured on earlier requests should give {speed:.2f}x", speed
        )
    return Route(
        "suffix",
        f"{where}drafting as measured on earlier requests would give {speed:.2f}x: lookups only",
        speed,
    )


def _route_mtp(measured_speed: float | None) -> Route:
    """``auto`` weighing the target's MTP layers: they run (adaptive, with lookups) until their
    controller has measured what they give, then as that measurement says."""
    if measured_speed is None:
        return Route("mtp+suffix", "not measured yet: the MTP layers run, adaptive, with lookups")
    return _by_measured_speed(measured_speed, "the MTP layers: ", "mtp+suffix")


def route(
    *,
    has_model: bool,
    costs: MachineCosts | None,
    model_acceptance: float | None,
    n_max: int,
    overlap: float = 0.0,
    measured_speed: float | None = None,
    drafter: str = "model",
) -> Route:
    """Pick the drafters for one request from the measured costs and what the pipeline has seen.

    Args:
        has_model: a draft model is loaded.
        costs: the machine's measured verify curve and draft cost (None: not measured yet).
        model_acceptance: acceptance per drafted token measured by earlier requests (None: a prior).
        n_max: the longest draft a round may ask for.
        overlap: the share of the prompt's n-grams the suffix cache has seen before.
        measured_speed: the draft model's speed (target alone = 1.0) its adaptive controller predicted
            on earlier requests of this pipeline, from what it measured; preferred to the formula.
        drafter: ``"model"`` (a draft model) or ``"mtp"`` (the target's MTP layers, measured by their
            adaptive controller only: their costs are not in ``costs``).

    Returns:
        The strategy for this request and the reason, with the expected speed of model drafting.
    """
    if not has_model:
        return Route("suffix", "no draft model loaded: lookups only (prompt, earlier requests, corpus)")
    with_lookups = f"{drafter}+suffix"
    if drafter == "mtp":
        return _route_mtp(measured_speed)
    if costs is None or costs.draft_ratio is None:
        return Route(with_lookups, "costs not measured yet: the draft model runs, adaptive, with lookups")
    a = PRIOR_ACCEPTANCE if model_acceptance is None else model_acceptance
    speed, k = model_speed(costs, a, n_max)
    where = f"a draft token costs {costs.draft_ratio:.2f} of a target token here"
    if not costs.steady:  # measured while something else used the CPU: said with the decision
        where += " (measured on a busy machine; `localspec cache clear --costs` measures again)"
    measured = "prior" if model_acceptance is None else "measured"
    if measured_speed is not None:
        return _by_measured_speed(measured_speed, where + "; ", with_lookups)
    if speed >= MIN_GAIN:
        why = f"{where}; at {measured} acceptance {a:.2f} drafting {k} tokens should give {speed:.2f}x"
        if overlap >= 0.5:
            why += f"; {overlap:.0%} of the prompt's n-grams were seen before, so lookups lead"
        return Route(with_lookups, why, speed)
    return Route(
        "suffix",
        f"{where}; at {measured} acceptance {a:.2f} the draft model would not pay "
        f"(best {speed:.2f}x): lookups only",
        speed,
    )
