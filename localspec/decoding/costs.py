"""What decoding costs on this machine: the verify curve V(b), measured once and kept.

``V(b)`` is the time of one target pass over ``b`` tokens with logits for every position (a verify pass
of ``b - 1`` drafts), in units of a one-token pass, so ``V(1) = 1``. It is a property of the machine,
the build and the model, not a law: on a Xeon VM it was about ``1 + 0.42 (b - 1)``, on an AMD EPYC VM
flat from 12 to 16 tokens (a kernel switch). A draft of ``k`` tokens that all pass yields ``k + 1``
tokens for ``V(k + 1)`` passes, so the curve says how long a draft must be, and how sure, to pay.

The curve is not smooth: on the 2-core EPYC VM of docs/archive/bench-notebook.md (2026-11-30) a 16-token pass
costs less than a 15-token one and 17 tokens cost 2.3 passes more (V(15), V(16), V(17) = 10.9, 9.9, 12.2; the
same dips at 32 and, smaller, at every multiple of 4: llama.cpp's repacked CPU kernels multiply four rows of
the batch at a time and each row left over alone), so
every width from 1 to 33 (a verify pass of up to :data:`localspec.settings.LOOKUP_N_MAX` drafts) is
measured rather than interpolated: interpolating between even widths made the suffix drafter choose
17-token passes it thought cheap (replayed on the recorded sessions: 1-5% slower).

Measuring it takes 20-30 seconds for a 1.5B model on two CPU cores (33 widths, interleaved, 3 sweeps), so
:func:`machine_costs` keeps the result per (machine, build, model file, threads, offload) under
``$LOCALSPEC_HOME/costs/`` and a new process reads it instead of paying probing rounds again. A stale or
unreadable file is measured again; ``localspec cache info`` lists the kept curves and ``localspec cache clear
--costs`` has them measured again.

A curve is kept for good, so one taken while something else used the CPU would mis-size every later draft
(seen here: two curves of the same model and build, one measured under load, 14% apart at b = 2 and 10% at
b = 16). Another process can only slow a pass down, so each width's cost is near its fastest timing (the
second-fastest, see :func:`typical`), and the sweeps go on (up to :data:`MAX_SWEEPS`) until the two fastest
timings of a one-token pass, and of nearly every width, agree within :data:`AGREEMENT`. A curve that never
settles is kept, marked unsteady, and said so; the next processes measure it again, up to
:data:`UNSTEADY_TRIES` measurements in all, and ``auto`` says with its decision that the costs it
decided by were measured on a busy machine.

The draft model's token cost ``c`` (``auto`` routes by ``c / T``) is held to the same rule. It used to be
timed once the sweeps were over, in 6-12 back-to-back passes, and nothing checked it: one busy spell then
covered every one of them, and a curve marked steady kept "a draft-model token 4.81 of a target token" for
a 0.5B draft of a 1.5B target (0.46-0.52 on a quiet machine, 0.68-0.69 on this one), so ``auto`` never
chose the draft model until ``cache clear --costs``. Now the draft is timed twice in every sweep, before
the middle width and before the widest (:data:`DRAFT_POINTS`), so its timings spread over the whole
20-30 s like the widths'; it costs its second-fastest timing, and the sweeps go on until its two fastest
agree within :data:`AGREEMENT` as well. A draft that never settles marks the measurement unsteady and is
said so the same way. The draft passes add 1.2% to a sweep (0.17 s of 14 s for that pair on 2 cores: four
draft passes against some 250 one-token target passes' worth over the 33 widths); on a quiet machine the
ratio is the old method's within 2% (0.684 and 0.692 against 0.681 and 0.680). Each timed draft pass
follows an uncounted one: right after a target pass a draft pass of the cache-resident embedded pair
costs 0.28 of a target token, the next 0.18, later ones 0.16 (its ratio reads 0.17 now, 0.12 from
back-to-back passes, where a run of drafts costs 0.16-0.28 a token). Curves kept with a draft model's
cost by the version before (cache version 3) are measured again once; those without one are kept (their
verify curve is measured the same way now).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec import constants
from localspec.decoding import speed

if TYPE_CHECKING:
    from localspec.llama.runtime import Model

#: The widths measured (every one: the curve has dips, see above); wider passes are extrapolated.
WIDTHS: tuple[int, ...] = tuple(range(1, 34))
#: Sweeps over every width: at least :data:`MIN_SWEEPS`, more while the timings disagree.
MIN_SWEEPS, MAX_SWEEPS = 3, 6
#: Two timings of one width agree when the slower is at most this fraction slower than the faster.
AGREEMENT = 0.05
#: A curve is steady when width 1 and all but this fraction of the widths agree (see :func:`unsteady_widths`).
UNSTEADY_SHARE = 0.1
#: Processes that measure again a kept curve that was unsteady, before it is kept for good (a machine that
#: is always busy then stops paying a measurement per process).
UNSTEADY_TRIES = 3
#: Where each sweep times the draft model's token: before these shares of the widths (the middle one and the
#: widest; never right before width 1, which every V(b) is divided by), one uncounted pass then a timed one
#: at each, so that the timed pass runs with the draft model's own data warm, as in a run of drafts.
DRAFT_POINTS = (0.5, 1.0)
#: 4: the draft model's token timed in every sweep and checked for agreement (3: the second-fastest timing
#: of each width, sweeps until steady, the draft timed once after them; 2: the median of 3; 1: 15 widths)
_VERSION = 4
#: Curves of version 3 without a draft model were measured as version 4 measures them, and are kept.
_SAME_WITHOUT_DRAFT = 3


@dataclass
class MachineCosts:
    """Seconds per one-token target pass, the draft model's per token (if any), and V(b)."""

    target_token_seconds: float
    verify: dict[int, float]  # width -> passes (V(1) = 1)
    draft_token_seconds: float | None = None
    key: str = ""
    measured: str = ""  # when, ISO 8601
    details: dict[str, Any] = field(default_factory=dict)

    def V(self, b: int) -> float:  # the paper's name for it
        """Cost of a ``b``-token verify pass in one-token passes (interpolated between measured widths)."""
        if b <= 1:
            return 1.0
        widths = sorted(self.verify)
        if b in self.verify:
            return self.verify[b]
        lo = max((w for w in widths if w < b), default=widths[0])
        hi = min((w for w in widths if w > b), default=None)
        if hi is None:  # past the widest measured: the slope over the upper half of the measured widths
            w2 = widths[-1]  # (one segment's slope may end in a dip or start from one)
            w1 = min(widths, key=lambda w: abs(w - w2 / 2)) if len(widths) > 1 else w2
            slope = (self.verify[w2] - self.verify[w1]) / (w2 - w1) if w2 != w1 else 0.0
            return self.verify[w2] + max(0.0, slope) * (b - w2)
        frac = (b - lo) / (hi - lo)
        return self.verify[lo] + frac * (self.verify[hi] - self.verify[lo])

    @property
    def draft_ratio(self) -> float | None:
        """A draft-model token's cost in target tokens (c / T)."""
        if self.draft_token_seconds is None or self.target_token_seconds <= 0:
            return None
        return self.draft_token_seconds / self.target_token_seconds

    @property
    def steady(self) -> bool:
        """False when the timings never agreed while measuring (something else was using the machine)."""
        return bool(self.details.get("steady", True))

    @property
    def unsteady_timings(self) -> str:
        """Which timings disagreed while measuring, for a message ("" when steady): the draft model's token,
        the pass widths (named, up to five), or both."""
        if self.steady:
            return ""
        parts = []
        if self.details.get("draft_steady") is False:
            parts.append("the draft model's token")
        widths = [str(w) for w in self.details.get("unsteady_widths") or []]
        if widths:
            more = f" and {len(widths) - 5} more" if len(widths) > 5 else ""
            parts.append(f"pass width{'s' if len(widths) > 1 else ''} {', '.join(widths[:5])}{more}")
        return " and ".join(parts) or "pass widths"

    def rollback_passes(self, k: int, acceptance: float) -> float:
        """What taking back the rejected part of a ``k``-token draft costs per round, in one-token passes, on
        a target with recurrent memory (0 for a transformer, and within the target's state snapshots).

        Past the snapshots every round copies the state out before its verify pass; a round with a rejection
        copies it back, and the tokens it kept are evaluated again in front of the next pass (a wider pass).

        Args:
            k: the draft length.
            acceptance: the chance that each drafted token is accepted (i.i.d.).

        Returns:
            The expected cost per round, in one-token passes.
        """
        r = self.details.get("rollback") or {}
        if not r:
            return 0.0
        return speed.rollback_passes(
            k,
            acceptance,
            save=float(r["save"]),
            restore=float(r["restore"]),
            snapshots=int(r.get("snapshots", 0)),
            verify=self.V,
        )

    def ceiling(self, k: int) -> float:
        """The speedup of perfect ``k``-token drafts that cost nothing: ``(k + 1) / V(k + 1)``."""
        return speed.speedup_at(speed.iid_reach(1.0, k), k, draft=0.0, verify=self.V)

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["verify"] = {str(k): v for k, v in self.verify.items()}
        d["version"] = _VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MachineCosts:
        version = d.get("version")
        if version == _SAME_WITHOUT_DRAFT and d.get("draft_token_seconds") is not None:
            raise ValueError(
                "its draft-model cost was measured by an older localspec without a check for load"
            )
        if version not in (_VERSION, _SAME_WITHOUT_DRAFT):
            raise ValueError("measured by another version of localspec")
        verify = {int(k): float(v) for k, v in d["verify"].items()}
        if 1 not in verify or len(verify) < 2 or not all(_usable(v) for v in verify.values()):
            raise ValueError("incomplete curve")
        target, draft = float(d["target_token_seconds"]), d.get("draft_token_seconds")
        if not _usable(target) or (draft is not None and not _usable(float(draft))):
            raise ValueError("unusable timing")
        return cls(
            target_token_seconds=target,
            verify=verify,
            draft_token_seconds=float(draft) if draft is not None else None,
            key=str(d.get("key", "")),
            measured=str(d.get("measured", "")),
            details=dict(d.get("details") or {}),
        )


def _usable(x: float) -> bool:
    """A measured cost: positive and finite (JSON may hold Infinity or NaN, and a file may be edited)."""
    return math.isfinite(x) and x > 0


def linear_costs(slope: float = 0.42, widths: tuple[int, ...] = WIDTHS) -> MachineCosts:
    """A stand-in curve ``V(b) = 1 + slope (b - 1)`` (the Xeon VM's), for tests and before measuring."""
    return MachineCosts(target_token_seconds=1.0, verify={w: 1.0 + slope * (w - 1) for w in widths})


def _file_id(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def _machine_id() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import llama_cpp

        build = f"{llama_cpp.__version__}:{llama_cpp.llama_print_system_info().decode(errors='replace')}"
    except Exception:  # any failure: the build string is only part of a cache key
        build = "unknown"
    return f"{platform.node()}|{cpu}|{os.cpu_count()}|{build}"


def costs_key(
    target: Path, draft: Path | None, *, threads: int, gpu_layers: int, draft_gpu_layers: int
) -> str:
    """What a measurement depends on: machine, build, model files, threads, offload."""
    parts = [
        _machine_id(),
        _file_id(target),
        _file_id(draft) if draft else "-",
        f"t{threads}",
        f"g{gpu_layers}/{draft_gpu_layers}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def costs_path(key: str) -> Path:
    return costs_dir() / f"{key}.json"


def read_costs(key: str) -> MachineCosts | None:
    """The stored measurement for ``key``, or None when there is none or it cannot be used."""
    path = costs_path(key)
    try:
        costs = MachineCosts.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return costs if costs.key == key else None


def write_costs(costs: MachineCosts) -> Path:
    """Store a measurement atomically (a temporary file, then a rename)."""
    path = costs_path(costs.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(costs.as_json(), indent=1), encoding="utf-8")
    os.replace(tmp, path)
    return path


def _time_pass(
    model: Model, base: list[int], tokens: list[int], timer: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds of one pass over ``tokens`` after ``base`` (logits for every position); cache put back."""
    todo = model.sync(base)
    if todo:
        model.decode(todo)  # the context itself is not timed
    model.checkpoint(ahead=len(tokens))  # recurrent memory: the pass is taken back after (not timed either)
    t = timer()
    try:
        model.decode_logits(tokens, outputs=len(tokens))
        return timer() - t
    finally:
        model.truncate(len(base))


def _two_fastest(timings: list[float]) -> list[float]:
    return sorted(timings)[:2]


def typical(timings: list[float]) -> float:
    """A width's cost: its second-fastest timing (the fastest when there is one). Another process only ever
    slows a pass down, so the fast end is the machine's own cost; the second rather than the fastest, because
    one pass now and then runs faster than the rest (seen here: a curve of fastest timings 9% low at b = 2,
    from one quick one-token pass) and two agreeing timings are what :func:`is_steady` asks for."""
    return _two_fastest(timings)[-1]


def agrees(timings: list[float], agreement: float = AGREEMENT) -> bool:
    """Whether the two fastest timings differ by at most ``agreement`` (a fraction of the faster); one
    timing agrees with nothing."""
    fastest = _two_fastest(timings)
    return len(fastest) == 2 and fastest[1] <= fastest[0] * (1.0 + agreement)


def unsteady_widths(times: dict[int, list[float]], agreement: float = AGREEMENT) -> list[int]:
    """The widths whose two fastest timings differ by more than ``agreement`` (a fraction of the faster)."""
    return [w for w, ts in sorted(times.items()) if not agrees(ts, agreement)]


def is_steady(times: dict[int, list[float]], agreement: float = AGREEMENT) -> bool:
    """Whether timings can be trusted: the narrowest width (every V(b) is a ratio to it) and all but
    :data:`UNSTEADY_SHARE` of the widths agree (see :func:`unsteady_widths`)."""
    bad = unsteady_widths(times, agreement)
    return bool(times) and min(times) not in bad and len(bad) <= UNSTEADY_SHARE * len(times)


def measure(
    target: Model,
    draft: Model | None = None,
    *,
    widths: tuple[int, ...] = WIDTHS,
    min_sweeps: int = MIN_SWEEPS,
    max_sweeps: int = MAX_SWEEPS,
    clock: Callable[[], str] = lambda: time.strftime("%Y-%m-%dT%H:%M:%S"),
    timer: Callable[[], float] = time.perf_counter,
) -> MachineCosts:
    """Measure V(b) on ``target`` and the draft's token cost: sweeps over every width (interleaved, so a
    slow spell touches all widths alike), at least ``min_sweeps`` and more up to ``max_sweeps`` until
    :func:`is_steady`; each width costs its :func:`typical` timing (near the fastest: a load only slows).
    The draft model's token is timed in every sweep too (at :data:`DRAFT_POINTS`, so a busy spell of a
    few seconds reaches only some of its timings), costs its :func:`typical` timing, and must
    :func:`agrees` as well for the sweeps to stop and the result to be steady.

    Uses a neutral context of repeated ordinary tokens after a short prefix; the caches are restored.
    """
    widths = tuple(w for w in widths if w + 64 < target.n_ctx and w <= target.max_draft + 1) or (1,)
    base = target.tokenize("def f(x):\n    return x + 1\n" * 4, add_bos=True)[:48]
    filler = (base * (1 + max(widths) // max(1, len(base))))[: max(widths)]
    target.reset()
    _time_pass(target, base, filler[:1], timer)  # warm-up, uncounted
    times: dict[int, list[float]] = {w: [] for w in widths}
    draft_times: list[float] = []
    draft_at = [min(len(widths) - 1, max(0, math.ceil(share * len(widths)) - 1)) for share in DRAFT_POINTS]
    if draft is not None:
        draft.reset()

    def settled() -> bool:
        return is_steady(times) and (draft is None or agrees(draft_times))

    sweeps = 0
    while sweeps < max(1, min_sweeps) or (sweeps < max_sweeps and not settled()):
        for i, w in enumerate(widths):
            if draft is not None:
                for _ in range(draft_at.count(i)):
                    _time_pass(draft, base, filler[:1], timer)  # uncounted: warms the draft's data
                    draft_times.append(_time_pass(draft, base, filler[:1], timer))
            times[w].append(_time_pass(target, base, filler[:w], timer))
        sweeps += 1
    one = typical(times[1]) if 1 in times else typical(times[widths[0]]) / widths[0]
    verify = {w: typical(ts) / one for w, ts in times.items()}
    verify[1] = 1.0
    details: dict[str, Any] = {
        "sweeps": sweeps,
        "widths": list(widths),
        "steady": settled(),
        "unsteady_widths": unsteady_widths(times),
    }
    if target.memory_kind != "attention":  # recurrent memory: what a rollback past its snapshots costs
        target.reset()
        target.decode(base)
        save, restore = zip(*(target.seq0.time_rollback() for _ in range(5)), strict=True)
        details["rollback"] = {
            "snapshots": target.n_rs_seq,
            "save": typical(list(save)) / one,
            "restore": typical(list(restore)) / one,
        }
    draft_s = None
    if draft is not None:
        draft_s = typical(draft_times)
        details["draft_steady"] = agrees(draft_times)
        draft.reset()
    target.reset()
    return MachineCosts(
        target_token_seconds=one,
        verify=verify,
        draft_token_seconds=draft_s,
        measured=clock(),
        details=details,
    )


def _key_of(
    target: Model, draft: Model | None, *, threads: int, gpu_layers: int, draft_gpu_layers: int
) -> str:
    return costs_key(
        target.path,
        draft.path if draft else None,
        threads=threads,
        gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
    )


def stored_costs(
    target: Model, draft: Model | None, *, threads: int, gpu_layers: int = 0, draft_gpu_layers: int = 0
) -> MachineCosts | None:
    """What :func:`machine_costs` would read without measuring; None when it would have to measure."""
    found = read_costs(
        _key_of(target, draft, threads=threads, gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers)
    )
    return found if found is not None and _settled(found) else None


def _settled(found: MachineCosts) -> bool:
    """A kept curve is used as it is: steady, or measured :data:`UNSTEADY_TRIES` times already."""
    return found.steady or int(found.details.get("tries", 1)) >= UNSTEADY_TRIES


def machine_costs(
    target: Model,
    draft: Model | None,
    *,
    threads: int,
    gpu_layers: int = 0,
    draft_gpu_layers: int = 0,
    remeasure: bool = False,
    notify: Callable[[str], None] | None = None,
) -> MachineCosts:
    """The stored costs for this machine, models and settings, measuring (and storing) them the first time."""
    key = _key_of(target, draft, threads=threads, gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers)
    found = None if remeasure else read_costs(key)
    if found is not None and _settled(found):
        return found
    tries = int(found.details.get("tries", 1)) if found is not None else 0
    if notify is not None:
        notify(
            f"measuring this machine's decoding costs once ({len(WIDTHS)} pass widths, {MIN_SWEEPS} times "
            "each, more if the machine is busy: 20-30 s for a 1.5B model on 2 CPU cores; kept for next time)"
        )
    costs = measure(target, draft)
    costs.key = key
    costs.details |= {
        "tries": tries + 1,
        "target": target.path.name,
        "draft": draft.path.name if draft else None,
        "threads": threads,
        "gpu_layers": [gpu_layers, draft_gpu_layers],
    }
    if notify is not None and not costs.steady:
        routed = " and `auto` may choose the draft model wrongly" if draft is not None else ""
        notify(
            f"the machine was busy while measuring (the timings of {costs.unsteady_timings} still differed "
            f"by more than {AGREEMENT:.0%} after {costs.details['sweeps']} sweeps), so drafts may be sized "
            f"for the wrong costs{routed}: "
            + (
                "the next process measures them again"
                if tries + 1 < UNSTEADY_TRIES
                else "when it is idle, `localspec cache clear --costs` has them measured again"
            )
        )
    try:
        write_costs(costs)
    except OSError:
        pass  # a read-only cache still gets the measurement for this process
    return costs


@dataclass
class StoredCurve:
    """A kept measurement (``localspec cache info``): its curve, or why it is not used."""

    path: Path
    size_bytes: int
    costs: MachineCosts | None = None
    problem: str = ""


def costs_dir() -> Path:
    return constants.localspec_home() / "costs"


def list_costs() -> list[StoredCurve]:
    """Every kept measurement, newest first; a file that cannot be used says why (it is measured again)."""
    out: list[StoredCurve] = []
    try:
        paths = [p for p in costs_dir().glob("*.json") if p.is_file() and not p.is_symlink()]
    except OSError:
        return out
    for path in paths:
        try:
            size, text = path.stat().st_size, path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            out.append(StoredCurve(path, 0, problem=f"cannot read it: {exc}"))
            continue
        try:
            out.append(StoredCurve(path, size, MachineCosts.from_json(json.loads(text))))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            out.append(StoredCurve(path, size, problem=str(exc) or type(exc).__name__))
    return sorted(out, key=lambda e: e.costs.measured if e.costs else "", reverse=True)


def clear_costs() -> list[Path]:
    """Delete every kept measurement (and leftover temporary files): the next run that needs one measures."""
    return constants.delete_files(costs_dir(), "*.json", ".*.tmp")
