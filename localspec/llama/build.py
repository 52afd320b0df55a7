"""What the installed llama.cpp build does on this CPU: the x86 features it uses, the cmake flags that
rebuild it, and whether its AMX kernels survive here.

llama.cpp built for a CPU with AMX (``-march=native`` on an Intel Xeon of the Sapphire Rapids kind and
later, what a plain ``pip install llama-cpp-python`` does there) moves the weights of quantized models
(Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS tensors: nearly every GGUF people run) into AMX buffers, and on
some machines its AMX matrix multiply kills the process at the first decode: SIGSEGV in
``ggml_backend_amx_mul_mat`` (llama.cpp issue 20824, open upstream; seen on this project's Xeon VM with the
llama.cpp that llama-cpp-python 0.3.36 vendors, on the Qwen2.5-Coder Q4_K_M pair) or SIGILL at
``tilezero`` on hypervisors that do not really allow AMX. A crash inside llama.cpp cannot be caught, so
:func:`check_amx` decodes once with the model in a child process before the real load (a few seconds,
once per build and model file; the verdict is kept under the cache folder) and turns a crash there into
a :class:`~localspec.errors.BuildError` with the rebuild command for this CPU. Builds without AMX, and
float models (F32/F16/BF16, which AMX does not take in this llama.cpp), are never probed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from localspec import constants
from localspec.errors import BuildError
from localspec.gguf.meta import read_metadata

#: The x86 CPU features ``llama_print_system_info`` reports: the ``/proc/cpuinfo`` flag that says a CPU has
#: one, and the cmake options that switch it on. A native build of the peer next to an AVX2 wheel would
#: compare builds, not engines: measured on this project's AVX-512 machine, llama-server built with
#: -march=native ran the 1.5B target 1.066x as fast as the same source built for AVX2 (46.8 against 43.9
#: tok/s, 2 threads).
CPU_FEATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "AVX": ("avx", ("GGML_AVX",)),
    "AVX_VNNI": ("avx_vnni", ("GGML_AVX_VNNI",)),
    "AVX2": ("avx2", ("GGML_AVX2",)),
    "F16C": ("f16c", ("GGML_F16C",)),
    "FMA": ("fma", ("GGML_FMA",)),
    "BMI2": ("bmi2", ("GGML_BMI2",)),
    "AVX512": ("avx512f", ("GGML_AVX512",)),
    "AVX512_VBMI": ("avx512vbmi", ("GGML_AVX512_VBMI",)),
    "AVX512_VNNI": ("avx512_vnni", ("GGML_AVX512_VNNI",)),
    "AVX512_BF16": ("avx512_bf16", ("GGML_AVX512_BF16",)),
    "AMX_INT8": ("amx_int8", ("GGML_AMX_TILE", "GGML_AMX_INT8")),
}
#: Never advised as a rebuild: llama.cpp's AMX kernels crash on some machines (see the module docstring).
NOT_ADVISED = frozenset({"AMX_INT8"})
#: ``general.file_type`` of all-float models (F32, F16, BF16): llama.cpp's AMX kernels take none of them.
FLOAT_FILE_TYPES = frozenset({0, 1, 32})
#: How long the probe may take: loading a large model from a cold disk is slow, and a probe that runs out
#: of time decides nothing (the real load goes ahead).
PROBE_TIMEOUT_S = 600.0


def installed_system_info() -> str:
    """What the installed llama-cpp-python's llama.cpp was built with (``CPU : AVX = 1 | ...``)."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()


def features_of(system_info: str) -> set[str]:
    """The features a llama.cpp build reports as on (``AVX2 = 1 | ...`` from ``llama_print_system_info``)."""
    return set(re.findall(r"\b([A-Z0-9_]+) = 1\b", system_info))


def cpu_flags(system_info: str, *, without: frozenset[str] = frozenset()) -> list[str]:
    """cmake flags that build llama.cpp with exactly the x86 features named in ``system_info`` (the
    installed llama-cpp-python's ``llama_print_system_info()``) less ``without``; [] when it names none
    (not x86: a native build there matches the wheel's default)."""
    present = features_of(system_info) - without
    if not present & {"AVX", "AVX2", "SSE3"}:
        return []
    flags = ["-DGGML_NATIVE=OFF"]
    for feature, (_, options) in CPU_FEATURES.items():
        flags += [f"-D{opt}={'ON' if feature in present else 'OFF'}" for opt in options]
    return flags


def unused_cpu_features(system_info: str, cpuinfo: str) -> list[str]:
    """The features this CPU has (``cpuinfo``: the text of ``/proc/cpuinfo``) that the llama.cpp build
    described by ``system_info`` does not use, AMX never included; [] off x86 or when nothing is missing."""
    lines = (line for line in cpuinfo.splitlines() if line.startswith("flags") and ":" in line)
    has = set(next((line.split(":", 1)[1].split() for line in lines), []))
    used = features_of(system_info)
    return [
        name
        for name, (flag, _) in CPU_FEATURES.items()
        if flag in has and name not in used and name not in NOT_ADVISED
    ]


# AMX ---------------------------------------------------------------------------------------------------
def rebuild_without_amx(system_info: str) -> str:
    """The command that reinstalls llama-cpp-python for this build's features less AMX."""
    import llama_cpp

    flags = " ".join(cpu_flags(system_info, without=NOT_ADVISED))
    return (
        f'CMAKE_ARGS="{flags}" pip install --no-cache-dir --force-reinstall --no-deps '
        f"llama-cpp-python=={llama_cpp.__version__}"
    )


def probe_command(model: Path, *, n_threads: int, n_gpu_layers: int) -> list[str]:
    """The child process that loads ``model`` and decodes once, as the real load would (:func:`_probe`)."""
    return [
        sys.executable,
        "-m",
        "localspec.llama.build",
        str(model),
        str(n_threads),
        str(n_gpu_layers),
    ]


def file_type_of(model: Path) -> int | None:
    """``general.file_type`` from the model's header; None when it has none or cannot be read (the real
    load reports an unreadable file)."""
    try:
        return read_metadata(model, tensors=False, merges=False).file_type
    except (OSError, ValueError):
        return None


def _verdict_path(model: Path, system_info: str) -> Path:
    import llama_cpp

    st = model.stat()
    lib = constants.llama_cpp_lib_path() or ""
    parts = (llama_cpp.__version__, system_info, lib, model.resolve(), st.st_size, st.st_mtime_ns)
    ident = "\0".join(map(str, parts))
    return verdicts_dir() / f"{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"


def verdicts_dir() -> Path:
    """Where the AMX check keeps its verdicts (one file per build and model file)."""
    return constants.localspec_home() / "amx"


def list_verdicts() -> list[Path]:
    """The kept verdicts (``localspec cache info``)."""
    try:
        return sorted(verdicts_dir().glob("*.json"))
    except OSError:
        return []


def clear_verdicts() -> list[Path]:
    """Delete every kept verdict (and leftover temporary files): the next load of a quantized model with an
    AMX build probes again (``localspec cache clear --costs``, after a rebuild or a llama.cpp fix)."""
    return constants.delete_files(verdicts_dir(), "*.json", "*.tmp")


def check_amx(model: Path, *, n_threads: int, n_gpu_layers: int) -> None:
    """Raise :class:`BuildError` when this llama.cpp build's AMX kernels crash on ``model`` here.

    Decides at once for a build without AMX, a float model, ``LOCALSPEC_TRUST_AMX`` set, or a verdict kept
    from an earlier probe of the same build and file; else runs :func:`probe_command` once and keeps its
    verdict: a child killed by a signal is a crash; a child that ran, failed otherwise, or ran out of time
    decides nothing (the real load reports its own errors).
    """
    if constants.trust_amx():
        return
    system_info = installed_system_info()
    if "AMX_INT8" not in features_of(system_info) or file_type_of(model) in FLOAT_FILE_TYPES:
        return
    path = _verdict_path(model, system_info)
    verdict = _read_verdict(path)
    if verdict is None:
        verdict = _probe(model, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        if verdict is None:
            return
        _write_verdict(path, verdict)
    if verdict.get("crashed"):
        raise BuildError(
            f"{model.name}: this llama.cpp build's AMX kernels crash on this machine "
            f"({verdict.get('signal', 'a signal')} in a test decode, llama.cpp issue 20824)",
            hint=f"rebuild llama-cpp-python without AMX: {rebuild_without_amx(system_info)} "
            f"(README: Troubleshooting); to load it anyway, set LOCALSPEC_TRUST_AMX=1 "
            f"(the verdict is kept in {path}; `localspec cache clear --costs` has the check run again)",
        )


def _probe(model: Path, *, n_threads: int, n_gpu_layers: int) -> dict | None:
    cmd = probe_command(model, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode == 0:
        return {"crashed": False, "command": shlex.join(cmd), "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return {"crashed": True, "signal": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    return None


def _read_verdict(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # none kept, or a damaged file: probe again
    return data if isinstance(data, dict) and isinstance(data.get("crashed"), bool) else None


def _write_verdict(path: Path, verdict: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # two processes probing at once never share one
        tmp.write_text(json.dumps(verdict), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only means probing again next time


def _probe_main(argv: list[str]) -> int:
    """The child: load the model as :class:`localspec.llama.runtime.Model` does and decode a 17-token batch
    and
    then one token (both kernel paths: wide verify passes and single steps)."""
    model, n_threads, n_gpu_layers = argv[0], int(argv[1]), int(argv[2])
    import llama_cpp

    llama = llama_cpp.Llama(
        model_path=model,
        n_ctx=64,
        n_batch=32,
        n_ubatch=32,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        n_gpu_layers=n_gpu_layers,
        verbose=False,
    )
    tokens = llama.tokenize(b"def add(a, b):\n    return a + b\n" * 4, add_bos=False)[:17]
    llama.eval(tokens)
    llama.eval(tokens[:1])
    return 0


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1:]))
