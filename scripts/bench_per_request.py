"""The session workloads as the command line runs them: a new process (pipeline) for every request.

Usage: python scripts/bench_per_request.py -t TARGET.gguf [--workload NAME ...] [--repeats 3] [--out F.json]

Each request loads a fresh pipeline with the suffix store on (as ``localspec run`` does), in a private
``LOCALSPEC_HOME`` that starts, every repeat, from the store the workload's warm-up sessions left (run the
same way first: their requests and the calibration they taught). Three settings, interleaved per repeat:
the target alone; the suffix cache with the calibration kept with the store (what localspec does); the
suffix cache with the calibration file deleted before every request (each process learns afresh, as before
the calibration was kept). Prints generation tokens/s and the median ratio to the target alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import localspec
from localspec import constants
from localspec.bench.sessions import SESSION_WORKLOADS, SessionWorkload, load_session_workload, run_session

SETTINGS = ("none", "suffix, calibration kept", "suffix, learnt afresh")


def _run(
    a: argparse.Namespace, wl: SessionWorkload, sessions: list, home: Path, setting: str
) -> tuple[int, float]:
    """Every request of ``sessions`` in a new pipeline under ``home``; (tokens, generation seconds)."""
    os.environ["LOCALSPEC_HOME"] = str(home)
    strategy = "none" if setting == "none" else "suffix"
    tokens, seconds = 0, 0.0

    def send(messages: list[dict[str, str]]) -> Any:
        nonlocal tokens, seconds
        if setting.endswith("afresh"):
            for f in (home / "suffix").glob("*.lscal"):
                f.unlink()
        with localspec.load(
            target=a.target,
            draft="none",
            n_threads=a.threads,
            n_ctx=a.n_ctx,
            strategy=strategy,
            corpus=wl.corpus,
        ) as pipe:
            reply = pipe.chat(messages, max_tokens=wl.max_tokens, strategy=strategy)
        tokens += reply.stats.generated_tokens
        seconds += reply.stats.total_seconds
        return reply

    for session in sessions:
        run_session(wl, session, send, clock=time.perf_counter)
    return tokens, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", "--target", required=True)
    ap.add_argument("--workload", action="append", choices=SESSION_WORKLOADS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--out")
    a = ap.parse_args()
    costs = constants.localspec_home() / "costs"  # measured once, shared by every private home
    out: dict[str, Any] = {}
    for name in a.workload or SESSION_WORKLOADS:
        wl = load_session_workload(name)
        with tempfile.TemporaryDirectory() as tmp:
            warm = Path(tmp) / "warm"
            if costs.is_dir():
                shutil.copytree(costs, warm / "costs")
            _run(a, wl, wl.warm, warm, "suffix, calibration kept")
            runs: dict[str, list[tuple[int, float]]] = {s: [] for s in SETTINGS}
            for r in range(a.repeats):
                order = SETTINGS if r % 2 == 0 else (SETTINGS[0], *reversed(SETTINGS[1:]))
                for setting in order:
                    home = Path(tmp) / f"r{r}-{SETTINGS.index(setting)}"
                    shutil.copytree(warm, home)
                    runs[setting].append(_run(a, wl, wl.measured, home, setting))
                    tok, sec = runs[setting][-1]
                    print(
                        f"{name} repeat {r + 1}: {setting}: {tok} tokens, {tok / sec:.2f} tok/s", flush=True
                    )
        base = [t / s for t, s in runs["none"]]
        row = {}
        for setting in SETTINGS:
            tps = [t / s for t, s in runs[setting]]
            row[setting] = {
                "tokens_per_second": tps,
                "speedup": statistics.median(x / b for x, b in zip(tps, base, strict=True)),
            }
        out[name] = row
        print(
            f"| {name} | " + " | ".join(f"{row[s]['speedup']:.2f}x" for s in SETTINGS[1:]) + " |", flush=True
        )
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
