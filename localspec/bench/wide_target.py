"""A big target from the files at hand: the target re-encoded at a wider type by llama.cpp's own tool.

A draft model pays most where a draft token costs a small share of a target token (a 7B-70B target, a
GPU). A machine without such a pair can still reach that regime: ``llama-quantize --allow-requantize``
(built from the llama.cpp that llama-cpp-python vendors, as the bench's peer is) re-encodes the same
weights at F16, BF16, Q8_0 or F32. The vocabulary is unchanged, so the draft still pairs; each target
token costs more, each draft token the same. ``localspec bench --wide-target F16`` measures there, and
the report says what the re-encoded target stands for.

The file is written once into localspec's cache folder (``wide-targets/``, :func:`wide_dir`) and reused
while its source is the same file (size and modification time); deleting that folder reclaims the space.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from localspec import constants
from localspec.errors import BenchError
from localspec.gguf.meta import model_file_stem, read_metadata
from localspec.llama import programs
from localspec.llama.processes import call_as_group
from localspec.settings import DraftSettings

#: What ``bench --wide-target`` runs when no ``--strategy`` is given (what scripts/bench_big_target.py ran):
#: the draft model drafting every position (k=8, p_min 0: its acceptance per position gives the ceiling
#: at the best length), at k=4 and k=8 with p_min 0.75, adaptive, and ``auto``.
WIDE_TARGET_SETTINGS: tuple[DraftSettings, ...] = (
    DraftSettings(strategy="model", n_max=8, p_min=0.0),
    DraftSettings(strategy="model", n_max=4, p_min=0.75),
    DraftSettings(strategy="model", n_max=8, p_min=0.75),
    DraftSettings(strategy="model", n_max=8, p_min=0.75, adaptive=True),
    DraftSettings(strategy="auto", n_max=8, p_min=0.75),
)

#: llama-quantize's names of the wider types, and the bytes a weight takes in each.
WIDE_TYPES: dict[str, float] = {"F16": 2.0, "BF16": 2.0, "Q8_0": 34 / 32, "F32": 4.0}


def wide_dir() -> Path:
    """Where re-encoded targets are kept (inside localspec's cache folder)."""
    return constants.localspec_home() / "wide-targets"


def _source_id(source: Path) -> dict[str, object]:
    st = source.stat()
    return {"source": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _expected_bytes(source: Path, wide_type: str) -> int | None:
    """About how large the re-encoded file will be (weights only), from the source's tensor list."""
    try:
        n_params = read_metadata(source, merges=False).n_params
    except Exception:  # an unreadable header: llama-quantize will say what is wrong
        return None
    return int(n_params * WIDE_TYPES[wide_type]) if n_params else None


def _check_room(folder: Path, needed: int | None, source: Path, wide_type: str) -> None:
    if needed is None:
        return
    free = shutil.disk_usage(folder).free
    if free < needed * 1.05:
        raise BenchError(
            f"re-encoding {source.name} at {wide_type} needs about {needed / 1e9:.1f} GB; "
            f"{folder} has {free / 1e9:.1f} GB free",
            hint="free some disk space, set LOCALSPEC_HOME to a larger disk, or pick a narrower type (Q8_0)",
        )


def wide_target(
    source: str | os.PathLike[str],
    wide_type: str,
    *,
    threads: int = 2,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The target ``source`` re-encoded at ``wide_type``, made once and kept in the cache.

    Args:
        source: the target GGUF file (any type llama-quantize reads).
        wide_type: one of :data:`WIDE_TYPES` (``F16``, ``BF16``, ``Q8_0``, ``F32``).
        threads: CPU threads for llama-quantize.
        log: called with progress lines (building the tool, re-encoding).

    Returns:
        The path of the re-encoded GGUF file.

    Raises:
        BenchError: an unknown type, too little disk space, or llama-quantize failing (with its log).
    """
    wide_type = wide_type.upper()
    if wide_type not in WIDE_TYPES:
        raise BenchError(
            f"unknown --wide-target type {wide_type!r}", hint=f"choose from {', '.join(WIDE_TYPES)}"
        )
    src = Path(source)
    if not src.is_file():
        raise BenchError(f"{src}: target file not found", hint="give the GGUF file of the target")
    folder = wide_dir()
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{model_file_stem(src)}.{wide_type}.gguf"
    sidecar = out.with_suffix(".json")
    ident = _source_id(src)
    if out.is_file() and sidecar.is_file():
        try:
            if json.loads(sidecar.read_text(encoding="utf-8")) == ident:
                return out
        except (OSError, ValueError):
            pass  # a torn or foreign note: make the file again
    _check_room(folder, _expected_bytes(src, wide_type), src, wide_type)
    tool = programs.quantize_binary(log=log)
    say = log or (lambda _m: None)
    say(f"re-encoding {src.name} at {wide_type} with llama-quantize (once; kept in {folder}) ...")
    partial = out.with_name(out.name + ".part")
    logfile = folder / "quantize.log"
    cmd = [str(tool), "--allow-requantize", str(src), str(partial), wide_type, str(threads)]
    try:
        with open(logfile, "w", encoding="utf-8") as fh:
            # as a process group that a Ctrl-C or a SIGTERM to this process takes down with it
            status = call_as_group(cmd, cwd=None, stdout=fh)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if status != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise BenchError(
            f"llama-quantize could not re-encode {src.name} at {wide_type} (exit status {status})",
            hint=f"see {logfile}",
        )
    partial.replace(out)
    sidecar.write_text(json.dumps(ident), encoding="utf-8")
    return out
