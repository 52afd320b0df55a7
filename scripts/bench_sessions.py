"""Run the multi-request workloads (localspec/data/sessions) on a pair and print markdown tables + JSON.

Usage: python scripts/bench_sessions.py -t TARGET.gguf [-d DRAFT.gguf] [--workload NAME ...] [--repeats N]
           [--ngram 4,8,16,32] [--suffix cold,warm,auto] [--threads 2] [--warm-afresh] [--no-token-table]
           [--peer] [--peer-modes none,ngram-mod,...] [--out F.json]
The same as `localspec bench --sessions [--peer]`, with the n-gram lengths, llama.cpp's modes and the output
file as options. ``--peer`` runs llama.cpp's own modes (localspec.bench.peer.SESSION_MODES) in the same
repeats.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import localspec
from localspec.bench.peer import SESSION_MODES
from localspec.bench.session_run import PeerSetup, SessionConfig, markdown, run_bench
from localspec.bench.sessions import SESSION_WORKLOADS
from localspec.settings import DraftSettings


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--target")
    ap.add_argument("-d", "--draft")
    ap.add_argument("--workload", action="append", choices=SESSION_WORKLOADS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ngram", default="4,8,16,32")
    ap.add_argument(
        "--suffix",
        default="cold,warm,auto",
        help="which suffix-cache settings to run: cold, warm (suffix strategy), auto (warm); '' for none",
    )
    ap.add_argument("--model", action="store_true", help="also measure the draft model alone (k=4)")
    ap.add_argument(
        "--warm-afresh",
        action="store_true",
        help="also the suffix cache warm with its calibration learnt afresh (the store's index only)",
    )
    ap.add_argument(
        "--no-token-table",
        action="store_true",
        help="also the suffix cache warm without its token table (token weight 0), for a side-by-side check",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--peer", action="store_true", help="also run llama.cpp's modes (llama-server)")
    ap.add_argument("--peer-modes", default=",".join(SESSION_MODES))
    ap.add_argument("--work-dir", default="bench-out/llama.cpp", help="llama-server logs, lookup files")
    ap.add_argument("--out")
    a = ap.parse_args()
    pipe = localspec.load(
        target=a.target, draft=a.draft or "none", n_threads=a.threads, n_ctx=a.n_ctx, suffix_store=False
    )
    configs = [SessionConfig(DraftSettings(strategy="ngram", n_max=int(k))) for k in a.ngram.split(",") if k]
    suffix = {
        "cold": SessionConfig(DraftSettings(strategy="suffix", n_max=32)),
        "warm": SessionConfig(DraftSettings(strategy="suffix", n_max=32), warm=True),
        "auto": SessionConfig(DraftSettings(strategy="auto", n_max=32), warm=True),
    }
    chosen = [s for s in a.suffix.split(",") if s]
    if unknown := sorted(set(chosen) - set(suffix)):
        ap.error(f"--suffix: unknown setting {', '.join(unknown)} (choose from {', '.join(suffix)})")
    configs += [suffix[s] for s in chosen]
    if a.warm_afresh:
        afresh = SessionConfig(DraftSettings(strategy="suffix", n_max=32), warm=True, calibration=False)
        configs.append(afresh)
    if a.no_token_table:
        configs.append(SessionConfig(DraftSettings(strategy="suffix", n_max=32), warm=True, token_weight=0.0))
    if a.model and a.draft:
        configs.append(SessionConfig(DraftSettings(strategy="model", n_max=4)))
    t0 = time.time()
    costs = pipe.machine_costs()
    print("V(b):", {b: round(v, 2) for b, v in sorted(costs.verify.items())}, flush=True)
    print(f"draft/target token cost: {costs.draft_ratio}", flush=True)
    setup = None
    builds: dict[str, object] = {}
    if a.peer:
        from localspec.bench import peer

        builds = {
            "localspec": peer.installed_system_info(),
            "llama.cpp peer": peer.cpu_flags(peer.installed_system_info()),
        }
        print(f"localspec's llama.cpp: {builds['localspec']}", flush=True)
        print(f"the peer is built with: {' '.join(peer.build_flags())}", flush=True)
        modes = tuple(m for m in a.peer_modes.split(",") if m and (m != "draft-simple" or a.draft))
        setup = PeerSetup(
            target=pipe.info.target_path,
            draft=pipe.info.draft_path,
            threads=a.threads,
            n_ctx=pipe.n_ctx,
            modes=modes,
            work_dir=Path(a.work_dir).resolve(),
        )
    results = run_bench(
        pipe,
        a.workload or list(SESSION_WORKLOADS),
        peer=setup,
        configs=configs,
        repeats=a.repeats,
        log=lambda line: print(f"[{time.time() - t0:6.0f}s] {line}", flush=True),
    )
    print(markdown(results))
    if a.out:
        with open(a.out, "w") as f:
            out = {
                "verify": costs.verify,
                "draft_ratio": costs.draft_ratio,
                "builds": builds,
                "results": results,
            }
            json.dump(out, f, indent=1)
    pipe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
