"""What decoding costs on this machine: the verify curve V(b), measured once and kept.

``V(b)`` is the time of one target pass over ``b`` tokens with logits for every position (a verify pass
of ``b - 1`` drafts), in units of a one-token pass, so ``V(1) = 1``. It is a property of the machine,
the build and the model, not a law: on a Xeon VM it was about ``1 + 0.42 (b - 1)``, on an AMD EPYC VM
flat from 12 to 16 tokens (a kernel switch). A draft of ``k`` tokens that all pass yields ``k + 1``
tokens for ``V(k + 1)`` passes, so the curve says how long a draft must be, and how sure, to pay.

The curve is not smooth: on the 2-core EPYC VM of docs/bench.md a 16-token pass costs less than a 15-token
one and 17 tokens cost 2.3 passes more (V(15), V(16), V(17) = 10.9, 9.9, 12.2; the same dips at 32 and,
smaller, at every multiple of 4: llama.cpp's repacked CPU kernels multiply four rows of the batch at a time
and each row left over alone), so
every width from 1 to 33 (a verify pass of up to :data:`localspec.settings.LOOKUP_N_MAX` drafts) is
measured rather than interpolated: interpolating between even widths made the suffix drafter choose
17-token passes it thought cheap (replayed on the recorded sessions: 1-5% slower).

Measuring it takes 20-30 seconds for a 1.5B model on two CPU cores (33 widths, interleaved, median of 3), so
:func:`machine_costs` keeps the result per (machine, build, model file, threads, offload) under
``$LOCALSPEC_HOME/costs/`` and a new process reads it instead of paying probing rounds again. A stale or
unreadable file is measured again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec import constants

if TYPE_CHECKING:
    from localspec.runtime import Model

#: The widths measured (every one: the curve has dips, see above); wider passes are extrapolated.
WIDTHS: tuple[int, ...] = tuple(range(1, 34))
_VERSION = 2  # 2: every width from 1 to 33 (version 1 measured 15 widths and interpolated)


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

    def ceiling(self, k: int) -> float:
        """The speedup of perfect ``k``-token drafts that cost nothing: ``(k + 1) / V(k + 1)``."""
        return (k + 1) / self.V(k + 1)

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["verify"] = {str(k): v for k, v in self.verify.items()}
        d["version"] = _VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MachineCosts:
        if d.get("version") != _VERSION:
            raise ValueError("another version")
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
    return constants.localspec_home() / "costs" / f"{key}.json"


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


def _time_pass(model: Model, base: list[int], tokens: list[int]) -> float:
    """Seconds of one pass over ``tokens`` after ``base`` (logits for every position); cache put back."""
    todo = model.sync(base)
    if todo:
        model.decode(todo)  # the context itself is not timed
    t = time.perf_counter()
    try:
        model.decode_logits(tokens, outputs=len(tokens))
        return time.perf_counter() - t
    finally:
        model.truncate(len(base))


def measure(
    target: Model,
    draft: Model | None = None,
    *,
    widths: tuple[int, ...] = WIDTHS,
    repeats: int = 3,
    clock: Callable[[], str] = lambda: time.strftime("%Y-%m-%dT%H:%M:%S"),
) -> MachineCosts:
    """Measure V(b) on ``target`` (widths interleaved, median of ``repeats``) and the draft's token cost.

    Uses a neutral context of repeated ordinary tokens after a short prefix; the caches are restored.
    """
    widths = tuple(w for w in widths if w + 64 < target.n_ctx and w <= target.max_draft + 1) or (1,)
    base = target.tokenize("def f(x):\n    return x + 1\n" * 4, add_bos=True)[:48]
    filler = (base * (1 + max(widths) // max(1, len(base))))[: max(widths)]
    target.reset()
    _time_pass(target, base, filler[:1])  # warm-up, uncounted
    times: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(max(1, repeats)):
        for w in widths:
            times[w].append(_time_pass(target, base, filler[:w]))
    one = statistics.median(times[1]) if 1 in times else statistics.median(times[widths[0]]) / widths[0]
    verify = {w: statistics.median(ts) / one for w, ts in times.items()}
    verify[1] = 1.0
    draft_s = None
    if draft is not None:
        draft.reset()
        dbase = base[:]
        _time_pass(draft, dbase, filler[:1])
        draft_s = statistics.median(_time_pass(draft, dbase, filler[:1]) for _ in range(max(3, repeats * 2)))
        draft.reset()
    target.reset()
    return MachineCosts(
        target_token_seconds=one,
        verify=verify,
        draft_token_seconds=draft_s,
        measured=clock(),
        details={"repeats": repeats, "widths": list(widths)},
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
    return read_costs(
        _key_of(target, draft, threads=threads, gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers)
    )


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
    if not remeasure:
        found = read_costs(key)
        if found is not None:
            return found
    if notify is not None:
        notify(
            f"measuring this machine's decoding costs once ({len(WIDTHS)} pass widths, 3 times each: "
            "20-30 s for a 1.5B model on two CPU cores; kept for next time)"
        )
    costs = measure(target, draft)
    costs.key = key
    try:
        write_costs(costs)
    except OSError:
        pass  # a read-only cache still gets the measurement for this process
    return costs
