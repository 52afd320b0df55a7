"""The draft model with a big target, in one run: ours against llama.cpp's draft-simple at its best length.

Runs, per prompt of the big-target workloads and interleaved (the target alone first, then each setting,
then llama.cpp's side on the same prompt): the target alone, the draft model at a fixed length (k=4 and
k=8, p_min 0.75, as llama.cpp), the adaptive draft model (the expected-gain stop), ``auto``; and
llama-server with ``--spec-type draft-simple`` at ``--spec-draft-n-max`` 2, 4, 6 and 8 (same p_min,
threads, context, token ids). With ``--temperature`` (and ``--top-p``) both sides sample alike: that
temperature and top-p, no top-k or min-p.

Prints per workload: each setting's median speedup over its own target alone, what the adaptive
controller predicted, ours at its best over llama.cpp at its best (tokens/s), and ``auto`` over the best
fixed setting. Writes the records as JSON.

Usage: python scripts/bench_big_target.py --target T.gguf --draft D.gguf [--wide-target F32] [--limit 3]
       [-n 64] [--repeats 3] [--temperature 0] [--no-peer] [--out bench-out/big-target.json]
       python scripts/bench_big_target.py --from-json bench-out/big-target.json   (the tables again)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from localspec.bench import peer as peer_mod
from localspec.bench.arithmetic import summarise
from localspec.bench.report import machine_info
from localspec.bench.single import engine_runner, open_pipeline, render, run_interleaved
from localspec.bench.wide_target import wide_target
from localspec.bench.workloads import BIG_TARGET_WORKLOADS, select_workloads
from localspec.settings import BASELINE, DraftSettings

#: drafts every position (no p_min): the best-length ceiling is computed from its per-position acceptance
UNSTOPPED = DraftSettings(strategy="model", n_max=8, p_min=0.0)
OURS = [
    UNSTOPPED,
    DraftSettings(strategy="model", n_max=4, p_min=0.75),
    DraftSettings(strategy="model", n_max=8, p_min=0.75),
    DraftSettings(strategy="model", n_max=8, p_min=0.75, adaptive=True),
    DraftSettings(strategy="auto", n_max=8, p_min=0.75),
]
PEER_LENGTHS = (2, 4, 6, 8)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _per_prompt(records: list[dict], engine: str, workload: str, config: str, key: str) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for r in records:
        if (r["engine"], r["workload"], r["config"]) == (engine, workload, config) and r["repeat"] >= 0:
            value = r["stats"].get(key)
            if value is not None:
                by.setdefault(r["prompt_id"], []).append(value)
    return {p: _median(v) for p, v in by.items()}


def summary(records: list[dict], workload: str, ours: list[str], peers: list[str]) -> dict:
    """Median speedups per setting on one workload, and the ratios the targets are about."""
    tps = {(e, c): _per_prompt(records, e, workload, c, "tokens_per_second") for e, c in _all(ours, peers)}
    base = {"localspec": tps[("localspec", "none")], "llama.cpp": tps.get(("llama.cpp", "none"), {})}
    out: dict = {"speedup": {}, "tps": {}, "predicted": {}}
    for engine, config in _all(ours, peers):
        if config == "none":
            continue
        rows = tps[(engine, config)]
        ratios = [rows[p] / base[engine][p] for p in rows if base[engine].get(p)]
        out["speedup"][f"{engine}: {config}"] = _median(ratios)
        out["tps"][f"{engine}: {config}"] = _median(list(rows.values()))
        if engine == "localspec":
            pred = _per_prompt(records, engine, workload, config, "predicted_speedup")
            if pred:
                out["predicted"][config] = _median(list(pred.values()))
    best_ours = max((c for c in ours if c != "none"), key=lambda c: out["tps"][f"localspec: {c}"])
    out["best_ours"] = best_ours
    if peers:
        best_peer = max((c for c in peers if c != "none"), key=lambda c: out["tps"][f"llama.cpp: {c}"])
        out["best_peer"] = best_peer
        out["ours_over_peer"] = out["tps"][f"localspec: {best_ours}"] / out["tps"][f"llama.cpp: {best_peer}"]
    fixed = [c for c in ours if c not in ("none",) and "auto" not in c and "adaptive" not in c]
    best_fixed = max(fixed, key=lambda c: out["speedup"][f"localspec: {c}"])
    auto = next(c for c in ours if c.startswith("auto"))
    out["auto_over_best_fixed"] = (
        out["speedup"][f"localspec: {auto}"] / out["speedup"][f"localspec: {best_fixed}"]
    )
    out["best_fixed"] = best_fixed
    return out


def ceilings(records: list[dict], workloads: list, configs: list[DraftSettings]) -> dict[str, dict]:
    """Per workload: the ceiling at the best fixed length that the measured acceptance and costs allow, and
    each setting's share of it.

    P(the first i+1 drafts are all accepted) comes from the draft model drafting every position
    (:data:`UNSTOPPED`, pooled over its runs), the draft cost ``c`` from the same runs, the verify cost of
    a pass of b >= 2 rows V(b) = v2 + s (b - 2) fitted over every setting's passes (in one-row passes); the
    ceiling is max over k of (1 + sum of the first k reach probabilities) / (k c + V(k + 1)).

    The line is not forced through V(1) = 1: going from one row to two costs more than each further row (a
    matrix-vector product becomes a matrix product), and a line through 1 promised 1.17x at k=1 on
    explanations where k=1 measured 0.89x."""
    cells, _ = summarise(workloads, configs, records)
    v2, slope = verify_line([(c.batch, c.v_at_batch, c.generated_tokens) for c in cells])
    out: dict[str, dict] = {}
    for w in workloads:
        runs = [
            r["stats"]
            for r in records
            if r["workload"] == w.name and r["config"] == UNSTOPPED.label and r["repeat"] >= 0
        ]
        cell = next((c for c in cells if c.workload == w.name and c.config == UNSTOPPED.label), None)
        drafting = sum((s.get("drafted_by_position") or [0])[0] for s in runs)
        if cell is None or not drafting or not (v2 >= 1.0 and slope >= 0.0):
            continue
        accepted = [0] * UNSTOPPED.n_max
        for s in runs:
            for i, n in enumerate((s.get("accepted_by_position") or [])[: UNSTOPPED.n_max]):
                accepted[i] += n
        reach = [a / drafting for a in accepted]
        by_k = {
            k: (1.0 + sum(reach[:k])) / (k * cell.c + v2 + slope * (k - 1))
            for k in range(1, UNSTOPPED.n_max + 1)
        }
        best_k = max(by_k, key=by_k.__getitem__)
        share = {c.config: c.speedup / by_k[best_k] for c in cells if c.workload == w.name}
        out[w.name] = {
            "ceiling": by_k[best_k],
            "best_k": best_k,
            "reach": reach,
            "c": cell.c,
            "v2": v2,
            "slope": slope,
            "share": share,
        }
    return out


def verify_line(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(V(2), slope) of the weighted least-squares line V(b) = V(2) + s (b - 2) through (mean width, cost in
    one-row passes, weight) points; a pass of 2 rows costs at least one row, the slope is not negative."""
    pts = [(b, v, w) for b, v, w in points if b == b and v == v and w > 0]  # no NaN
    sw = sum(w for _, _, w in pts)
    if sw <= 0:
        return float("nan"), float("nan")
    mb = sum(w * b for b, _, w in pts) / sw
    mv = sum(w * v for _, v, w in pts) / sw
    den = sum(w * (b - mb) ** 2 for b, _, w in pts)
    slope = max(0.0, sum(w * (b - mb) * (v - mv) for b, v, w in pts) / den) if den > 1e-12 else 0.0
    return max(1.0, mv + slope * (2.0 - mb)), slope


def _all(ours: list[str], peers: list[str]) -> list[tuple[str, str]]:
    return [("localspec", c) for c in ["none", *ours]] + [
        ("llama.cpp", c) for c in (["none", *peers] if peers else [])
    ]


def _ceiling_text(share: float) -> str:
    return f"  {share:.0%} of the ceiling"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--from-json", help="summarise the records of an earlier run's JSON again; runs nothing")
    ap.add_argument("--wide-target", choices=["F16", "BF16", "Q8_0", "F32"])
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--out", default="bench-out/big-target.json")
    args = ap.parse_args(argv)
    if args.from_json:
        earlier = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        limit = earlier["settings"]["limit"]
        report(earlier, earlier["records"], select_workloads(list(BIG_TARGET_WORKLOADS), limit), None)
        return 0
    if not (args.target and args.draft):
        ap.error("--target and --draft are needed (or --from-json)")

    def log(m: str) -> None:
        print(f"  {m}", file=sys.stderr, flush=True)

    target = wide_target(args.target, args.wide_target, log=log) if args.wide_target else Path(args.target)
    wl = select_workloads(list(BIG_TARGET_WORKLOADS), args.limit)
    pipe = open_pipeline(str(target), args.draft, None, threads=args.threads, n_ctx=args.n_ctx)
    servers: dict = {}
    try:
        peer_run, peer_cfgs = None, []
        if not args.no_peer:
            peer_cfgs = [DraftSettings(strategy="model", n_max=k, p_min=0.75) for k in PEER_LENGTHS]
            servers = peer_mod.start_servers(
                [BASELINE, *peer_cfgs],
                target=target,
                draft=Path(args.draft),
                threads=args.threads,
                n_ctx=pipe.n_ctx,
                log=log,
            )
            peer_run = peer_mod.peer_runner(
                servers, render=lambda pr: render(pipe, pr)[0], temperature=args.temperature, top_p=args.top_p
            )
        records = run_interleaved(
            engine_runner(pipe, temperature=args.temperature, top_p=args.top_p),
            wl,
            OURS,
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            peer=peer_run,
            peer_configs=peer_cfgs,
            progress=log,
        )
    finally:
        for s in servers.values():
            s.close()
        pipe.close()
    result = {
        "machine": machine_info(args.threads),
        "target": str(target),
        "draft": args.draft,
        "settings": vars(args),
        "peer_configs": [c.label for c in peer_cfgs],
    }
    report(result, records, wl, Path(args.out))
    return 0


def report(result: dict, records: list[dict], wl: list, out: Path | None) -> None:
    """Summarise the records into ``result``, write it to ``out`` (when given) and print the tables."""
    ours = [c.label for c in OURS if any(r["config"] == c.label for r in records)]
    peers = sorted({r["config"] for r in records if r["engine"] == "llama.cpp" and r["config"] != "none"})
    result["workloads"] = {w.name: summary(records, w.name, ours, peers) for w in wl}
    result["ceilings"] = ceilings(records, wl, [c for c in OURS if c.label in ours])
    result["records"] = records
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    for name, s in result["workloads"].items():
        print(f"\n{name}")
        for key, sp in s["speedup"].items():
            config = key.split(": ", 1)[1]
            pred = s["predicted"].get(config) if key.startswith("localspec") else None
            share = result["ceilings"].get(name, {}).get("share", {}).get(config)
            print(
                f"  {key:42s} {sp:5.2f}x  {s['tps'][key]:6.2f} tok/s"
                + (f"  predicted {pred:.2f}x" if pred else "")
                + (_ceiling_text(share) if share and key.startswith("localspec") else "")
            )
        ceil = result["ceilings"].get(name)
        if ceil:
            reach = " ".join(f"{r:.2f}" for r in ceil["reach"])
            print(
                f"  ceiling at the best fixed length: {ceil['ceiling']:.2f}x (k={ceil['best_k']}; "
                f"c {ceil['c']:.2f}, V(b) = {ceil['v2']:.2f} + {ceil['slope']:.3f} (b-2), "
                f"P(first i accepted) {reach})"
            )
        if "ours_over_peer" in s:
            best = f"ours best ({s['best_ours']}) / llama.cpp best ({s['best_peer']})"
            print(f"  {best}: {s['ours_over_peer']:.2f}")
        print(f"  auto / best fixed ({s['best_fixed']}): {s['auto_over_best_fixed']:.2f}")
    if out is not None:
        print(f"\nwrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())
