"""Tiny random models of any architecture llama.cpp runs, written by llama.cpp's own ``test-llama-archs``.

The program is built once from the llama.cpp that llama-cpp-python vendors, in the peer's build folder
(:func:`localspec.bench.peer.archs_binary`, minutes the first time, as for rpc-server). ``-a ARCH -s SEED``
writes a 2-layer model with n_embd 256 and a 128-token dummy vocabulary ("test" tokenizer, ids only); another
seed gives a model with the same vocabulary and other weights: a draft most of whose tokens are rejected.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from localspec.errors import BenchError

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

    from localspec.bench import peer

    try:
        with peer_build_cache():
            return peer.archs_binary()
    except BenchError as exc:
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
