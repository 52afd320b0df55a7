"""A draft model's loop, for one sequence or for several at once.

Each draft step of a draft model is one pass of it. When several generations run together (a
:class:`~localspec.decoding.batch.Batch`), each drafting on its own sequence of the same draft model, their
steps share passes: the first pass feeds every sequence what it has not seen (the tokens accepted since its
last draft) and the following ones one drafted token per sequence still drafting, so drafting for N requests
costs about as many passes as drafting for one. :func:`joint_drafting` collects the drafts the drafters are
asked for while it is open (a :class:`DraftJob` each) and runs them together when it closes; outside it a
draft runs at once, alone, through the same loop (:func:`draft_jobs`).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from localspec.decoding.draft import Draft, Pick
from localspec.llama.sampling import SamplingParams, distribution, sample

if TYPE_CHECKING:
    from localspec.decoding.stopping import GainStop
    from localspec.llama.runtime import Model
    from localspec.llama.sequence import Sequence


@dataclass(frozen=True)
class Limits:
    """Where a model's draft stops without a measured rule: ``p_min`` after ``n_min`` tokens, and the ids it
    never proposes (``mask``)."""

    n_min: int
    p_min: float
    mask: np.ndarray | None  # ids never proposed


def pick(
    logits: np.ndarray,
    i: int,
    params: SamplingParams,
    rng: np.random.Generator,
    stop: GainStop | None,
    limits: Limits,
) -> Pick | None:
    """Draft step ``i``'s token from a model's logits row, or None where the draft ends: without ``stop`` a
    top probability under ``p_min`` ends it (after ``n_min`` tokens), as in llama.cpp; with it, the measured
    expected gain decides.

    Args:
        logits: the model's row for this step.
        i: the step (0 for the first drafted token).
        params: sampling (greedy at temperature 0).
        rng: the generation's random numbers.
        stop: the round's measured stopping rule, if any.
        limits: the ``p_min``/``n_min`` rule and the masked ids.

    Returns:
        The token with its distribution and the model's confidence, or None.
    """
    row = logits
    if limits.mask is not None:
        row = row.copy()
        row[limits.mask] = -np.inf
    q = None if params.greedy else distribution(row, params)
    if q is None:
        tok = int(np.argmax(row))
        p_top = 1.0 / float(np.exp(row - row[tok]).sum())
    else:
        p_top = float(q.max())
    if stop is not None:
        if not stop.keep(i, p_top):
            return None
    elif limits.p_min > 0.0 and i >= limits.n_min and p_top < limits.p_min:
        return None
    if q is not None:
        tok = sample(q, rng)
    return Pick(tok, q, p_top)


@dataclass
class DraftJob:
    """One generation's draft by a draft model: where (the model and its sequence), from what (the context,
    whose last token is pending), how many tokens at most and how to choose them; ``out`` is filled in
    place."""

    model: Model
    seq: Sequence
    context: list[int]
    n: int
    params: SamplingParams
    rng: np.random.Generator
    stop: GainStop | None
    limits: Limits
    n_vocab: int  # the target's vocabulary (a sampled draft's distribution is fitted to it)
    out: Draft = field(default_factory=lambda: Draft(source="model"))
    logits: np.ndarray | None = None  # the row for its next step
    going: bool = True


_JOINT: contextvars.ContextVar[list[DraftJob] | None] = contextvars.ContextVar("joint_drafting", default=None)


@contextlib.contextmanager
def joint_drafting() -> Iterator[None]:
    """While the block runs, draft-model drafts asked for are collected (each :class:`DraftJob`'s ``out`` is
    handed back empty); when it closes they run together, sharing passes per draft model
    (:func:`draft_jobs`), and every ``out`` is filled."""
    jobs: list[DraftJob] = []
    token = _JOINT.set(jobs)
    try:
        yield
    finally:
        _JOINT.reset(token)
    by_model: dict[int, list[DraftJob]] = {}
    for job in jobs:
        by_model.setdefault(id(job.model), []).append(job)
    for group in by_model.values():
        draft_jobs(group)


def submit(job: DraftJob) -> Draft:
    """Run ``job`` now, or, inside :func:`joint_drafting`, when the block closes.

    Returns:
        Its draft (filled by then).
    """
    jobs = _JOINT.get()
    if jobs is None:
        draft_jobs([job])
    else:
        jobs.append(job)
    return job.out


def draft_jobs(jobs: list[DraftJob]) -> None:
    """Draft for every job (all on one draft model, each on its own sequence), sharing the passes: a first
    pass feeds each sequence what it lacks, then one pass per draft step over the sequences still drafting.
    A job's ``out`` gets its tokens, its count of passes (``evals``), and its share of the first pass's time
    (``first_seconds``, ``fed``), which the adaptive controller prices."""
    jobs = [j for j in jobs if _clip(j)]
    if not jobs:
        return
    _first_pass(jobs)
    i = 0
    while jobs:
        jobs = [j for j in jobs if _step(j, i)]
        if jobs:
            model = jobs[0].model
            rows = model.decode_many([(j.seq, [j.out.tokens[-1]], 1) for j in jobs])
            for j, r in zip(jobs, rows, strict=True):
                j.logits = r[0]
                j.out.evals += 1
        i += 1


def _clip(job: DraftJob) -> bool:
    """The job's length within its sequence's room; False when nothing can be drafted."""
    job.n = min(job.n, job.model.n_ctx - len(job.context) + 1)  # its drafts must fit its own context
    return job.n > 0


def _first_pass(jobs: list[DraftJob]) -> None:
    """Each sequence synced to its context and fed what it lacks, its last token's row kept: in one pass when
    the tokens fit the batch (otherwise the long ones are fed first, on their own)."""
    model = jobs[0].model
    todo = [model.sync(j.context, keep_last=1, seq=j.seq) for j in jobs]
    if sum(model.batch_width(j.seq, t) for j, t in zip(jobs, todo, strict=True)) > model.n_batch:
        for j, t in zip(jobs, todo, strict=True):
            if len(t) > 1:
                model.decode(t[:-1], seq=j.seq)
        todo = [t[-1:] for t in todo]
    t0 = time.perf_counter()
    rows = model.decode_many([(j.seq, t, 1) for j, t in zip(jobs, todo, strict=True)])
    seconds = time.perf_counter() - t0
    width = sum(len(t) for t in todo)
    for j, t, r in zip(jobs, todo, rows, strict=True):
        j.logits = r[0]
        j.out.first_seconds = seconds * len(t) / width
        j.out.evals, j.out.fed = 1, len(t)
        model.checkpoint(ahead=j.n - 1, seq=j.seq)  # recurrent memory: the drafts decoded next may go back


def _step(job: DraftJob, i: int) -> bool:
    """Draft step ``i`` of ``job`` from its row; True when it drafts one more (another pass for it)."""
    assert job.logits is not None
    chosen = pick(job.logits, i, job.params, job.rng, job.stop, job.limits)
    if chosen is None:
        return False
    job.out.add(chosen, job.n_vocab)
    return i + 1 < job.n and (job.stop is None or job.stop.go_on())
