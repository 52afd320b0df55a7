"""Tiny random models of any architecture llama.cpp runs, written by llama.cpp's own ``test-llama-archs``.

The program is built once from the llama.cpp that llama-cpp-python vendors, beside llama.cpp's other
programs (:func:`localspec.llama.programs.archs_binary`, minutes the first time, as for rpc-server).
``-a ARCH -s SEED`` writes a 2-layer model with n_embd 256 and a 128-token dummy vocabulary ("test" tokenizer,
ids only); another seed gives a model with the same vocabulary and other weights: a draft most of whose
tokens are rejected.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from localspec.errors import BuildError

#: Recurrent or hybrid architectures the vendored llama.cpp writes with test-llama-archs.
RECURRENT_FIXTURES = (
    "qwen35",
    "qwen35moe",
    "qwen3next",
    "mamba2",
    "lfm2",
    "nemotron_h",
    "granitehybrid",
    "falcon-h1",
    "jamba",
)


def archs_program() -> Path:
    """The built ``test-llama-archs`` (skips the test when it cannot be built here)."""
    from _peer_cache import peer_build_cache

    from localspec.llama import programs

    try:
        with peer_build_cache():
            return programs.archs_binary()
    except BuildError as exc:
        pytest.skip(f"llama.cpp's test-llama-archs could not be built: {exc.message}")


def write_model(folder: Path, arch: str, seed: int) -> Path:
    """A random ``arch`` model written with ``seed`` (its dense variant, else its MoE one)."""
    out = folder / f"{arch}-seed{seed}"
    if not out.is_dir():
        out.mkdir(parents=True)
        cmd = [str(archs_program()), "-a", f"^{re.escape(arch)}$", "-s", str(seed), "-o", str(out)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    files = sorted(out.glob("*-dense.gguf")) or sorted(out.glob("*.gguf"))
    if not files:
        pytest.fail(f"test-llama-archs wrote no model for {arch}")
    return files[0]


def vendored_arch_source() -> str:
    """``src/llama-arch.cpp`` of the vendored llama.cpp (the peer's extracted source)."""
    program = archs_program()  # the source is extracted on the way, beside the build folder
    source = program.parents[2] / "src" / "src" / "llama-arch.cpp"
    return source.read_text(encoding="utf-8")


#: Per architecture, the projections through which a block writes into the residual stream: zeroed, a
#: block adds nothing to its input (and llama.cpp still computes it in full).
RESIDUAL_WRITES = {
    "llama": ("attn_output.weight", "ffn_down.weight"),
    "qwen35": ("attn_output.weight", "ssm_out.weight", "ffn_down.weight"),
    "granitehybrid": (
        "attn_output.weight",
        "attn_output.bias",
        "ssm_out.weight",
        "ffn_down.weight",
        "ffn_down.bias",
    ),
}


def widen(src: Path, out: Path, *, n_ff: int, copies: int) -> Path:
    """``src`` made as costly per token as a bigger model while computing the same function: the FFN width
    raised to ``n_ff`` (the new gate/up rows random, the new down columns zero) and each of its blocks
    repeated ``copies`` more times after the originals with their residual writes zeroed (same recurrent /
    attention pattern, so the copies carry recurrent state and KV cache as real layers do).

    Args:
        src: a model written by :func:`write_model` of an architecture in :data:`RESIDUAL_WRITES`.
        out: the file to write (kept if it exists).
        n_ff: the FFN width, at least the model's own.
        copies: how many extra copies of the blocks to append.

    Returns:
        ``out``.
    """
    import gguf
    import numpy as np
    from _gguf_build import architecture, grown_header, set_value, tensors_of, write_gguf

    if out.is_file():
        return out
    reader = gguf.GGUFReader(src)
    arch, n_layer = architecture(reader)
    zeroed = RESIDUAL_WRITES[arch]
    tensors = tensors_of(reader)
    rng = np.random.default_rng(n_ff)
    for i in range(n_layer):
        gate, up, down = (f"blk.{i}.ffn_{p}.weight" for p in ("gate", "up", "down"))
        extra = n_ff - tensors[gate].shape[0]
        if extra < 0:
            raise ValueError(f"n_ff {n_ff} is below the model's {tensors[gate].shape[0]}")
        scale = float(tensors[gate].std()) or 0.02
        for name in (gate, up):
            more = rng.standard_normal((extra, tensors[name].shape[1])).astype(np.float32) * scale
            tensors[name] = np.concatenate([tensors[name], more], axis=0)
            bias = name.replace(".weight", ".bias")
            if bias in tensors:
                tensors[bias] = np.concatenate([tensors[bias], np.zeros(extra, np.float32)])
        tensors[down] = np.concatenate(
            [tensors[down], np.zeros((tensors[down].shape[0], extra), np.float32)], 1
        )
    for c in range(1, copies + 1):
        for i in range(n_layer):
            here, there = f"blk.{i}.", f"blk.{i + c * n_layer}."
            for name in [k for k in tensors if k.startswith(here)]:
                value = tensors[name]
                if name.endswith(zeroed):
                    value = np.zeros_like(value)
                tensors[name.replace(here, there, 1)] = value
    fields = grown_header(
        reader, list(range(n_layer)) * copies
    )  # the copies' per-layer settings: the originals'
    ffn = f"{arch}.feed_forward_length"
    width = fields[ffn][0]
    set_value(fields, ffn, [n_ff if v else 0 for v in width] if isinstance(width, list) else n_ff)
    return write_gguf(out, arch=arch, fields=fields, tensors=tensors)


def unrendered_tables(page: str, results: tuple[str, ...]) -> list[str]:
    """The result files (docs/results/) whose table, as ``scripts/bench_hybrid.py --from-json`` prints it,
    is not in the docs page ``page`` (docs/)."""
    import importlib.util
    import json

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("bench_hybrid", root / "scripts" / "bench_hybrid.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = (root / "docs" / page).read_text()
    missing = []
    for name in results:
        saved = json.loads((root / "docs" / "results" / name).read_text())
        if script.table(saved["rows"], saved["machine"], saved["measured"]) not in text:
            missing.append(name)
    return missing
