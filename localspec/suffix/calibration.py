"""What the suffix drafter learns from what the target accepted, and what it carries to the next request.

Copies run in bursts, so what is learnt is the acceptance of a proposal's i-th token *given the ones
before it were accepted*, per kind of proposal (:func:`kind_of`: its source, match length band, agreement
and number of occurrences) and position bucket (:data:`POSITION_BAND`): a run-length survival curve per kind,
kept as cells of [trials that reached the position, of them accepted]. Beside it, per source and token
id, a token table: how often a proposed token was reached and accepted, which scales that token's
acceptance (its *hazard*, :class:`TokenHazard`). A request starts from what the last one carried
(:func:`carried_cells`, :func:`carried_token_cells`; the store keeps it for a new process), and the
store's files are read back through :func:`cells_from` and :func:`token_cells_from`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from localspec.decoding.draft import SOURCES
from localspec.suffix.confidence import MAX_DRAFT
from localspec.suffix.index import EXTENTS, Proposal


class Kind(NamedTuple):
    """What the acceptance of a proposal is learnt by (:func:`kind_of`)."""

    source: str
    band: int  # match length band (see :data:`_BANDS`)
    unanimous: bool  # every occurrence agrees on its first token
    occurrences: int  # 0: one occurrence, 1: 2-3, 2: 4 or more


class Cell(NamedTuple):
    """One calibration cell as a store keeps it: a :class:`Kind`'s fields, the position bucket, then the
    trials that reached that position and how many of them were accepted."""

    source: str
    band: int
    unanimous: bool
    occurrences: int
    bucket: int
    reached: float
    accepted: float


class TokenCell(NamedTuple):
    """One token's evidence as a store keeps it: source, token id, trials that reached it, of them
    accepted."""

    source: str
    token: int
    reached: float
    accepted: float


#: Match lengths that start a new band of :func:`kind_of` (2-3, 4-7, 8-11, 12-15, 16-31, 32-63 and 64 or
#: more tokens, the last two from :attr:`Proposal.extent`).
_BANDS = (4, 8, 12, 16, *EXTENTS)
_BAND_AT = [sum(length >= edge for edge in _BANDS) for length in range(_BANDS[-1] + 1)]  # by match length
#: Drafted position -> calibration bucket: 0, 1, 2-3, 4-7, 8-15, 16-31, 32 and later.
POSITION_BAND = tuple(min(i.bit_length(), 6) for i in range(MAX_DRAFT + 1))
#: The runs of :data:`POSITION_BAND`: (bucket, first position, end).
SEGMENTS = tuple(
    (bucket, POSITION_BAND.index(bucket), len(POSITION_BAND) - POSITION_BAND[::-1].index(bucket))
    for bucket in sorted(set(POSITION_BAND))
)
BUCKET_END = tuple(end for _, start, end in SEGMENTS for _ in range(start, end))  # by position
_CALIBRATION_WEIGHT = 4.0  # pseudo-trials at the prior before measured acceptance dominates
#: Before any evidence a position is trusted at this fraction of its smoothed frequency: one earlier
#: occurrence scores ~0.95, but such drafts are accepted far less often, and where a 2-token pass costs
#: two single ones each wrong draft costs a whole token per drafted token. Evidence comes free (see
#: :class:`localspec.suffix.drafter.SuffixDrafter`), so a kind earns its drafts without paying for wrong
#: ones; where verifying is cheap (a flat V(b)) the discounted prior still drafts at once.
PRIOR_TRUST = 0.75
#: Proposals of one kind watched at once (each round's proposals are watched until one is wrong or ends).
WATCHES_PER_KIND = 8

#: A request starts from the calibration the last one left (saved with the store, for a new process), each
#: cell scaled down to at most this many trials (its acceptance kept): enough to draft at once where copies
#: ran before, few enough that this request's own evidence soon outweighs it.
CARRIED_TRIALS = 64
#: Only these sources' cells are carried: how far a copy of the request's own prompt runs (an editor's file,
#: the earlier turns of a chat) is a property of the model and the kind of work, and carries over; how closely
#: a new request follows earlier ones or the corpus is not, and is learnt afresh (carrying it made the
#: repository workload slower, within one process as across processes: docs/archive/bench-notebook.md). So
#: :meth:`localspec.suffix.drafter.SuffixDrafter.begin` starts every request from this carry, and the
#: drafter's token table (see :data:`TOKEN_WEIGHT`) is carried for these sources alone, too.
CARRIED_SOURCES = ("prompt",)
_CELL_SOURCES = tuple(s for s in SOURCES if s != "model")  # what the suffix index proposes from

#: Pseudo-trials at its source's rate before a token's own acceptance counts (see :class:`TokenHazard`): of
#: the weights replayed on the recorded sessions (docs/archive/bench-notebook.md), 4 is the one that loses
#: nowhere.
TOKEN_WEIGHT = 4.0
#: A request starts from the token table the last one left, for :data:`CARRIED_SOURCES` only (the other
#: sources' tables are learnt afresh in every request, as their calibration is: carrying the history's table
#: too made the conversation sessions slower, docs/archive/bench-notebook.md), the counts scaled down together
#: to at most this many trials in all (their rates kept), and only the :data:`CARRIED_TOKENS` most-reached
#: tokens: the table forgets old work gradually, and a server and a new process per request start alike.
TOKEN_TRIALS = 1 << 14
CARRIED_TOKENS = 4096

#: The calibration as the drafter counts it: (kind, position bucket) -> [reached, accepted].
Calibration = dict[tuple[Kind, int], list[float]]
#: A token table: per source, per token id, [trials that reached that token, of them accepted].
TokenTable = dict[str, dict[int, list[float]]]


def token_cells_from(rows: Iterable[Any], n_vocab: int | None = None) -> list[TokenCell]:
    """Checked token cells (from a store file); raises ValueError naming the first bad one."""
    out: list[TokenCell] = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 4:
            raise ValueError(f"token cell {i} is not a list of 4 fields")
        source, token, reached, accepted = row
        if (
            source not in _CELL_SOURCES
            or type(token) is not int
            or not 0 <= token < (n_vocab if n_vocab else 1 << 31)
            or not all(type(x) in (int, float) and math.isfinite(x) for x in (reached, accepted))
            or not 0 <= accepted <= reached <= TOKEN_TRIALS
        ):
            raise ValueError(f"token cell {i} is out of range: {row!r}")
        out.append(TokenCell(str(source), token, float(reached), float(accepted)))
    return out


def cells_from(rows: Iterable[Any]) -> list[Cell]:
    """Checked calibration cells (from a store file); raises ValueError naming the first bad one."""
    out: list[Cell] = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 7:
            raise ValueError(f"cell {i} is not a list of 7 fields")
        source, band, unanimous, occurrences, bucket, reached, accepted = row
        numbers = (reached, accepted)
        if (
            source not in _CELL_SOURCES
            or type(band) is not int
            or not 0 <= band <= len(_BANDS)
            or type(unanimous) is not bool
            or type(occurrences) is not int
            or not 0 <= occurrences <= 2
            or type(bucket) is not int
            or not 0 <= bucket <= POSITION_BAND[-1]
            or not all(type(x) in (int, float) and math.isfinite(x) for x in numbers)
            or not 0 <= accepted <= reached <= CARRIED_TRIALS
        ):
            raise ValueError(f"cell {i} is out of range: {row!r}")
        out.append(Cell(str(source), band, unanimous, occurrences, bucket, float(reached), float(accepted)))
    return out


def calibration_of(cells: Iterable[Cell]) -> Calibration:
    """Cells as :attr:`SuffixDrafter.calibration` counts them: (kind, bucket) -> [reached, accepted]."""
    return {
        (Kind(source, band, unanimous, occurrences), bucket): [reached, accepted]
        for source, band, unanimous, occurrences, bucket, reached, accepted in cells
    }


def carried_cells(calibration: Calibration) -> list[Cell]:
    """The cells of :data:`CARRIED_SOURCES` for the next request or process, each scaled down to at most
    :data:`CARRIED_TRIALS` trials, its acceptance kept."""
    out: list[Cell] = []
    for ((source, band, unanimous, occurrences), bucket), (reached, accepted) in calibration.items():
        if reached <= 0 or source not in CARRIED_SOURCES:
            continue
        kept = min(float(reached), CARRIED_TRIALS)
        share = min(max(accepted / reached, 0.0), 1.0)  # (rounding never pushes a cell out of range)
        out.append(Cell(source, band, unanimous, occurrences, bucket, kept, kept * share))
    return out


def token_tables(cells: Iterable[TokenCell]) -> tuple[TokenTable, dict[str, list[float]]]:
    """Token cells as the drafter counts them: the table, and per source the sums [reached, accepted]."""
    tables: TokenTable = {}
    totals: dict[str, list[float]] = {}
    for source, token, reached, accepted in cells:
        tables.setdefault(source, {})[token] = [reached, accepted]
        total = totals.setdefault(source, [0.0, 0.0])
        total[0] += reached
        total[1] += accepted
    return tables, totals


def carried_token_cells(tables: TokenTable, totals: dict[str, list[float]]) -> list[TokenCell]:
    """The token table for the next request or process: per source of :data:`CARRIED_SOURCES`, the
    :data:`CARRIED_TOKENS` tokens reached most often, all of that source's counts scaled by one factor so
    that they sum to at most :data:`TOKEN_TRIALS` trials."""
    out: list[TokenCell] = []
    for source, table in tables.items():
        reached_all = totals[source][0]
        if reached_all <= 0 or source not in CARRIED_SOURCES:
            continue
        scale = min(1.0, TOKEN_TRIALS / reached_all)
        rows: Iterable[tuple[int, list[float]]] = table.items()
        if len(table) > CARRIED_TOKENS:
            rows = sorted(rows, key=lambda kv: -kv[1][0])[:CARRIED_TOKENS]
        for token, (reached, accepted) in rows:
            kept = min(reached * scale, float(TOKEN_TRIALS))
            share = min(max(accepted / reached, 0.0), 1.0) if reached > 0 else 0.0
            out.append(TokenCell(source, token, kept, kept * share))
    return out


def kind_of(prop: Proposal) -> Kind:
    """What the acceptance of a proposal is learnt by: its source, its match length band (see
    :data:`_BANDS`), whether every occurrence agrees on its first token, and how many occurrences it
    follows (1, 2-3, 4 or more)."""
    length = max(prop.match_length, prop.extent)
    band = _BAND_AT[length] if length < len(_BAND_AT) else len(_BANDS)
    child, parent = prop.counts[0] if prop.counts else (0, 0)
    return Kind(prop.source, band, child == parent, 0 if parent <= 1 else 1 if parent <= 3 else 2)


_COARSE_BAND = 4  # kinds of longer matches (by extent) learn from the 16-token band's evidence too


def lineage_of(kind: Kind) -> tuple[Kind, ...]:
    """The coarser kinds whose evidence a kind starts from, coarsest first (a kind seen rarely borrows
    what its neighbours measured rather than the raw prior): kinds of long extent start from the same
    kind banded at 16+."""
    source, band, unanimous, occurrences = kind
    return (Kind(source, _COARSE_BAND, unanimous, occurrences),) if band > _COARSE_BAND else ()


def pulled(
    calibration: Calibration, prior_trust: float, chain: Iterable[Kind], bucket: int
) -> tuple[float, float]:
    """(a, b) such that a token of smoothed frequency c is calibrated to ``a + b * c`` at this position
    bucket: ``prior_trust * c`` pulled towards each kind's measured acceptance in turn, ``x ->
    (accepted + w x) / (reached + w)`` with w = :data:`_CALIBRATION_WEIGHT` (affine in x, so the chain is
    one multiply-add per token)."""
    a, b = 0.0, prior_trust
    weight = _CALIBRATION_WEIGHT
    for kind in chain:
        reached, accepted = calibration.get((kind, bucket), (0, 0))
        share = weight / (reached + weight)
        a, b = accepted / (reached + weight) + share * a, share * b
    return a, b


@dataclass(slots=True)
class TokenHazard:
    """How a source's tokens scale their calibrated acceptance: by ``(accepted_t + w r) / ((reached_t + w)
    r)``, where r is the source's rate over all its tokens and w = :data:`TOKEN_WEIGHT` pseudo-trials at
    it: 1 for a token seen no more or less often rejected than the rest."""

    table: dict[int, list[float]]  # per token id: [reached, accepted]
    weight: float  # w
    weighted_rate: float  # w r
    rate: float  # r

    @classmethod
    def of(
        cls, tables: TokenTable, totals: dict[str, list[float]], source: str, weight: float
    ) -> TokenHazard | None:
        """``source``'s hazard, or None without a table (or with ``weight`` 0: the table is off)."""
        table = tables.get(source) if weight > 0 else None
        if not table:
            return None
        reached_all, accepted_all = totals[source]
        rate = (accepted_all + 1.0) / (reached_all + 2.0)
        return cls(table, weight, weight * rate, rate)

    def scaled(self, x: float, token: int) -> float:
        """``x`` scaled by ``token``'s factor (a token without a cell: unchanged), at most 1."""
        cell = self.table.get(token)
        if cell is None:
            return x
        x *= (cell[1] + self.weighted_rate) / ((cell[0] + self.weight) * self.rate)
        return x if x < 1.0 else 1.0
