"""What taking drafts back costs on recurrent and hybrid targets, and localspec against llama.cpp's own loop.

For each architecture, tiny random models written by llama.cpp's test-llama-archs (seed 1 the target, seed 2 a
draft of the same vocabulary whose tokens are mostly rejected; the target as its own draft has them mostly
accepted), greedy, the same prompt of token ids. Per setting, interleaved over ``--repeats``: localspec's
tokens/s, its rollback seconds per drafting round (state copies) and the tokens it evaluated again after a
restore; with ``--peer PATH`` (llama.cpp's ``llama-speculative-simple`` built from the same vendored source),
llama.cpp's own speculative loop on the same files and settings (``--spec-type draft-simple``, the same draft
length, p-min 0), and the ratio. llama.cpp's loop stops after the round that passes ``-n``, so it decodes up
to a draft more than asked: localspec then generates as many tokens as it decoded, so that both rates count
the same work. Medians over repeats.

With ``--mtp``: MTP drafting instead, on qwen35 files with an MTP block (a random head, and one fitted to the
target: tests/_mtp_model.py), against llama.cpp's ``--spec-type draft-mtp`` on the same files.

With ``--assistant``: Gemma 4's shared-memory MTP instead: a tiny gemma4 target and gemma4-assistant drafters
(random, and fitted to the target: tests/_gemma4_model.py), against llama.cpp's ``--spec-type draft-mtp -md``.

With ``--eagle3`` or ``--dflash``: EAGLE-3 or DFlash drafter files (random, and fitted to the target:
tests/_feature_drafters.py) for a llama target, against llama.cpp's ``--spec-type draft-eagle3`` /
``draft-dflash -md``; ``--n-max`` is the draft length (a DFlash block holds at most ``block_size - 1``).

With ``--wide``: the target is made as costly per token as a real model (tests/_arch_models.py ``widen``:
FFN width 16384 and 16 layers, about 830 MB of F32, tens of ms a token on two cores) while computing the
same function, so that the loops' own overhead no longer decides the ratio; the drafts stay tiny (seed 2:
other weights; seed 1: the narrow twin, whose tokens are the target's). qwen35 (snapshots) and
granitehybrid (checkpoints); with ``--mtp``, qwen35 with the MTP block on the wide file; with ``--assistant``,
a gemma4 of FFN width 16384 and 32 layers (about 810 MB of F32); with ``--eagle3`` / ``--dflash``, the llama
target widened the same way.

    python scripts/bench_hybrid.py --peer /path/to/llama-speculative-simple --json out.json
    python scripts/bench_hybrid.py --mtp --peer /path/to/llama-speculative-simple --json mtp.json
    python scripts/bench_hybrid.py --wide --peer /path/to/llama-speculative-simple --json wide.json
    python scripts/bench_hybrid.py --assistant --wide --peer /path/to/llama-speculative-simple
    python scripts/bench_hybrid.py --dflash --wide --n-max 7 --peer /path/to/llama-speculative-simple
    python scripts/bench_hybrid.py --from-json docs/results/hybrid-rollback.json   (the table again)
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import localspec
from localspec.llama import programs

#: qwen3 (a transformer of the same size) is the control: what the loops cost apart from any rollback.
ARCHS = (
    "qwen3",
    "qwen35",
    "lfm2",
    "nemotron_h",
    "qwen3next",
    "granitehybrid",
    "mamba2",
    "jamba",
    "falcon-h1",
)
#: ``--wide``: the archs it widens (their residual writes are known), the FFN width, the extra block copies.
WIDE_ARCHS = ("qwen35", "granitehybrid")
WIDE_FF, WIDE_COPIES = 16384, 7
#: The prompt: the dummy "test" tokenizer turns each 5 characters into one id, the same on both sides.
PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


def write(folder: Path, arch: str, seed: int) -> Path:
    out = folder / f"{arch}-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    archs = programs.archs_binary(log=print)
    cmd = [str(archs), "-a", f"^{re.escape(arch)}$", "-s", str(seed), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return (sorted(out.glob("*-dense.gguf")) or sorted(out.glob("*.gguf")))[0]


#: A case: the arch label, the target, the draft's label, the draft file (None: the target's MTP layers), and
#: llama.cpp's speculative type for it (draft-simple: a draft model; draft-mtp: the target's MTP layers or an
#: MTP assistant; draft-eagle3, draft-dflash: those drafter files).
Case = tuple[str, Path, str, Path | None, str]


def ours(target: Path, draft: Path | None, spec: str, n_max: int, tokens: int, threads: int) -> dict:
    """One localspec run: tokens/s, rollback seconds per drafting round, replayed tokens, acceptance.
    ``spec``: llama.cpp's type for the drafter (a draft model runs as ``model``, the rest as ``mtp``)."""
    strategy = "model" if spec == "draft-simple" else "mtp"
    with localspec.load(
        target,
        draft or "none",
        strategy=strategy,
        n_ctx=512,
        n_threads=threads,
        n_max=n_max,
        suffix_store=False,
    ) as pipe:
        ids = pipe.tokenize(PROMPT)
        list(pipe.stream_tokens(ids, max_tokens=8, strategy=strategy, adaptive=False, p_min=0.0))  # warm-up
        out = list(pipe.stream_tokens(ids, max_tokens=tokens, strategy=strategy, adaptive=False, p_min=0.0))
        s = out[-1].stats
        drafting = max(1, s.rounds)
        return {
            "tok_s": s.generated_tokens / (s.total_seconds or 1e-9),
            "rollback_ms_per_round": 1000 * s.rollback_seconds / drafting,
            "replayed_per_round": s.replayed_tokens / drafting,
            "round_ms": 1000 * s.total_seconds / drafting,
            "acceptance": s.acceptance_rate,
            "tokens": [r.token for r in out],
        }


def alone(target: Path, tokens: int, threads: int) -> float:
    """localspec's tokens/s with the target alone (no drafting), for the speed-up a drafter gives."""
    kw = {"strategy": "none", "n_ctx": 512, "n_threads": threads, "suffix_store": False}
    with localspec.load(target, "none", **kw) as pipe:
        ids = pipe.tokenize(PROMPT)
        list(pipe.stream_tokens(ids, max_tokens=8, strategy="none"))  # warm-up
        out = list(pipe.stream_tokens(ids, max_tokens=tokens, strategy="none"))
        s = out[-1].stats
        return s.generated_tokens / (s.total_seconds or 1e-9)


def theirs(
    binary: Path, target: Path, draft: Path | None, spec: str, n_max: int, tokens: int, threads: int
) -> dict:
    """llama.cpp's own speculative loop on the same files: its decode speed and acceptance
    (``--spec-type SPEC``, with ``-md`` for a drafter file)."""
    kind = ["--spec-type", spec] + (["-md", str(draft)] if draft else [])
    cmd = [
        str(binary), "-m", str(target), "-p", PROMPT, *kind,
        "-n", str(tokens), "-t", str(threads), "--temp", "0",
        "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0", "--draft-p-min", "0",
        "-c", "512", "--seed", "1",
    ]  # fmt: skip
    for _ in range(3):  # its log is written by a thread: a fast exit sometimes loses the last lines
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        text = run.stdout + run.stderr
        speed = re.search(r"decoded\s+(\d+) tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", text)
        accept = re.search(r"accept\s+=\s+([\d.]+)%", text)
        if run.returncode != 0 or speed:
            break
    if run.returncode != 0 or not speed:
        raise RuntimeError(f"llama-speculative-simple failed ({run.returncode}): {text[-800:]}")
    return {
        "tok_s": float(speed.group(2)),
        "acceptance": float(accept.group(1)) / 100 if accept else None,
        "tokens": int(speed.group(1)),  # its loop stops after the round that passes -n: up to a draft more
    }


def cpu_name() -> str:
    """The CPU's model name and its AVX-512 or AVX2 level, from /proc/cpuinfo where there is one."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = re.search(r"model name\s*:\s*(.+)", info)
    found = re.search(r"flags\s*:\s*(.+)", info)
    flags = set(found.group(1).split()) if found else set()
    level = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name.group(1).strip() if name else platform.machine()} ({level})"


def table(rows: list[dict], machine: str, measured: str | None = None) -> str:
    """The Markdown table of a run (with llama.cpp's acceptance when the run recorded it, and the speed-up
    over the target alone when it measured that), under a line that says what it ran on and when
    (``measured``: the run's date, YYYY-MM-DD)."""
    theirs_accepted = any("llama_cpp_acceptance" in r for r in rows)
    alone = any("vs_alone" in r for r in rows)
    extra = (" llama.cpp accepted |" if theirs_accepted else "") + (" vs target alone |" if alone else "")
    lines = [
        f"{machine}; measured {measured}" if measured else machine,
        "",
        "| arch | draft | accepted | rollback ms | replayed | round ms | tok/s | llama.cpp |"
        + extra
        + " ratio |",
        "|---|---|---|---|---|---|---|---|---|" + ("---|" * (theirs_accepted + alone)),
    ]
    for r in rows:
        theirs_s = f"{r['llama_cpp_tok_s']:.0f}" if "ratio" in r else "-"
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        accepted = f" {r['llama_cpp_acceptance']:.0%} |" if "llama_cpp_acceptance" in r else " - |"
        speedup = f" {r['vs_alone']:.2f}x |" if "vs_alone" in r else " - |"
        lines.append(
            f"| {r['arch']} | {r['draft']} | {r['acceptance']:.0%} | {r['rollback_ms_per_round']:.3f} | "
            f"{r['replayed_per_round']:.2f} | {r['round_ms']:.2f} | {r['tok_s']:.0f} | {theirs_s} |"
            f"{accepted if theirs_accepted else ''}{speedup if alone else ''} {ratio} |"
        )
    return "\n".join(lines)


def cases(folder: Path, args: argparse.Namespace) -> list[Case]:
    """What to run: per architecture a draft of other weights and the target itself; with ``--mtp``, qwen35
    files whose MTP head is random and fitted (tests/_mtp_model.py), drafting with it (draft None); with
    ``--assistant``, a gemma4 target with random and fitted assistants (tests/_gemma4_model.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from _arch_models import widen  # test fixtures: the same files the tests run

    def wide(arch: str) -> Path:
        out = folder / f"{arch}-wide.gguf"
        return widen(write(folder, arch, 1), out, n_ff=WIDE_FF, copies=WIDE_COPIES)

    if args.eagle3 or args.dflash:
        from _feature_drafters import dflash_drafter, eagle3_drafter

        target = wide("llama") if args.wide else write(folder, "llama", 1)
        label = "wide llama" if args.wide else "llama"
        if args.eagle3:
            return [
                (label, target, f"EAGLE-3 ({kind})", eagle3_drafter(folder, target, kind), "draft-eagle3")
                for kind in ("random", "token")
            ]
        return [
            (label, target, f"DFlash ({kind})", dflash_drafter(folder, target, kind), "draft-dflash")
            for kind in ("random", "fitted")
        ]
    if args.assistant:
        from _gemma4_model import gemma4_assistant, gemma4_target

        shape = {"n_ff": WIDE_FF, "n_layer": 32} if args.wide else {}
        target = gemma4_target(folder, **shape)
        label = "wide gemma4" if args.wide else "gemma4"
        return [
            (label, target, f"assistant ({kind})", gemma4_assistant(folder, target, kind), "draft-mtp")
            for kind in ("random", "token")
        ]
    if args.mtp:
        from _mtp_model import mtp_model

        base = wide("qwen35") if args.wide else None
        label = "wide qwen35" if args.wide else "qwen35"
        return [
            (label, mtp_model(folder, kind, base=base), f"MTP head ({kind})", None, "draft-mtp")
            for kind in ("random", "token")
        ]
    out: list[Case] = []
    if args.wide:
        archs = WIDE_ARCHS if args.archs == ",".join(ARCHS) else tuple(args.archs.split(","))
        for arch in archs:
            target, other, twin = wide(arch), write(folder, arch, 2), write(folder, arch, 1)
            out += [
                (f"wide {arch}", target, "other weights", other, "draft-simple"),
                (f"wide {arch}", target, "narrow twin", twin, "draft-simple"),
            ]
        return out
    for arch in args.archs.split(","):
        target, other = write(folder, arch, 1), write(folder, arch, 2)
        out += [
            (arch, target, "other weights", other, "draft-simple"),
            (arch, target, "itself", target, "draft-simple"),
        ]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--peer", type=Path, help="llama.cpp's llama-speculative-simple, for the ratio")
    ap.add_argument("--n-max", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--mtp", action="store_true", help="MTP drafting on qwen35 files with an MTP block instead"
    )
    ap.add_argument(
        "--assistant", action="store_true", help="Gemma 4's shared-memory MTP: gemma4 + assistant files"
    )
    ap.add_argument("--eagle3", action="store_true", help="EAGLE-3 drafter files for a llama target")
    ap.add_argument("--dflash", action="store_true", help="DFlash drafter files for a llama target")
    ap.add_argument(
        "--wide", action="store_true", help="targets widened to a real model's cost per token (see above)"
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--from-json", type=Path, help="print the table of an earlier run's JSON; runs nothing")
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        print(table(saved["rows"], saved["machine"], saved.get("measured")))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch, target, label, draft, spec in cases(Path(tmp), args):
            runs: dict[str, list[dict]] = {"ours": [], "theirs": [], "alone": []}
            for _ in range(args.repeats):  # interleaved: a slow spell touches both alike
                tokens = args.tokens
                if args.peer:
                    peer_run = theirs(args.peer, target, draft, spec, args.n_max, args.tokens, args.threads)
                    runs["theirs"].append(peer_run)
                    tokens = peer_run["tokens"]  # as many tokens as llama.cpp's loop decoded
                runs["ours"].append(ours(target, draft, spec, args.n_max, tokens, args.threads))
                if args.eagle3 or args.dflash:  # the speed-up over the target alone, measured beside
                    runs["alone"].append({"tok_s": alone(target, tokens, args.threads)})
            row: dict[str, object] = {"arch": arch, "draft": label}
            for key in ("tok_s", "rollback_ms_per_round", "replayed_per_round", "round_ms", "acceptance"):
                row[key] = statistics.median(r[key] for r in runs["ours"])
            if runs["alone"]:
                pairs = zip(runs["ours"], runs["alone"], strict=True)
                row["vs_alone"] = statistics.median(a["tok_s"] / b["tok_s"] for a, b in pairs)
            if runs["theirs"]:
                theirs_tok_s = statistics.median(r["tok_s"] for r in runs["theirs"])
                row["llama_cpp_tok_s"] = theirs_tok_s
                accepted = [r["acceptance"] for r in runs["theirs"] if r["acceptance"] is not None]
                if accepted:  # its text may differ from ours where logits are near ties (batch splits)
                    row["llama_cpp_acceptance"] = statistics.median(accepted)
                row["ratio"] = statistics.median(r["tok_s"] for r in runs["ours"]) / theirs_tok_s
                each = [a["tok_s"] / b["tok_s"] for a, b in zip(runs["ours"], runs["theirs"], strict=True)]
                row["ratio_range"] = [min(each), max(each)]  # repeat by repeat: how far noise moves it
            rows.append(row)
            print(json.dumps(row), flush=True)
    machine = f"{cpu_name()}, {args.threads} threads, n_max {args.n_max}, {args.tokens} tokens, greedy"
    measured = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    print("\n" + table(rows, machine, measured))
    if args.json:
        saved = {"machine": machine, "measured": measured, "rows": rows}
        args.json.write_text(json.dumps(saved, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
