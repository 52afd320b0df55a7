#!/usr/bin/env python
"""Time localspec's GGUF header reader against gguf.GGUFReader, side by side (a benchmark, not a test).

    python scripts/bench_gguf_reader.py                      # the vocab files in tests/data/vocab
    python scripts/bench_gguf_reader.py a.gguf b.gguf -n 5   # any GGUF files, 5 runs each
    python scripts/bench_gguf_reader.py --skip-reference     # ours only (GGUFReader takes seconds)

Columns: ours with merges skipped (what `localspec scan` does), ours with everything decoded, then
gguf.GGUFReader opening the file and reading the token list; medians of the runs, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from localspec.gguf.meta import read_metadata  # noqa: E402


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def gguf_reader(path: Path) -> int:
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = reader.fields.get("tokenizer.ggml.tokens")
    return len(field.contents()) if field is not None else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("-n", "--runs", type=int, default=5, help="runs per file for our reader (median)")
    ap.add_argument("--reference-runs", type=int, default=1, help="runs per file for gguf.GGUFReader")
    ap.add_argument("--skip-reference", action="store_true", help="do not time gguf.GGUFReader")
    args = ap.parse_args()
    files = args.files or sorted((ROOT / "tests" / "data" / "vocab").glob("*.gguf"))
    print(f"{'file':34} {'tokens':>8} {'ours, scan':>11} {'ours, all':>10} {'GGUFReader':>11} {'ratio':>7}")
    for path in files:
        meta = read_metadata(path, merges=False)
        n = len(meta.kv.get("tokenizer.ggml.tokens") or [])
        fast = median_ms(lambda p=path: read_metadata(p, merges=False), args.runs)
        full = median_ms(lambda p=path: read_metadata(p), args.runs)
        if args.skip_reference:
            ref_s, ratio = "-", "-"
        else:
            ref = median_ms(lambda p=path: gguf_reader(p), args.reference_runs)
            ref_s, ratio = f"{ref:9.0f}ms", f"{ref / fast:6.0f}x"
        print(f"{path.name[:34]:34} {n:>8,} {fast:9.1f}ms {full:8.1f}ms {ref_s:>11} {ratio:>7}", flush=True)


if __name__ == "__main__":
    main()
