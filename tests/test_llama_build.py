"""The AMX check: a llama.cpp build whose AMX kernels crash here gets a clear error, not a dead process.

The crash itself needs an AMX build on a machine where it crashes (docs/archive/bench-notebook.md: an Intel
Xeon with AMX);
here the child process is real and its outcome is chosen: killed by a signal, exited, succeeded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _gguf_build import write_gguf
from click.testing import CliRunner

from localspec import constants
from localspec.cli import main
from localspec.errors import BuildError
from localspec.llama import build as llama_build
from localspec.llama.runtime import Model

AMX_BUILD = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | OPENMP = 1 | "
    "REPACK = 1 |"
)
AVX2_BUILD = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | REPACK = 1 |"
Q4_K_M = 15


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


CRASHES = _child("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
SURVIVES = _child("pass")
FAILS = _child("raise SystemExit(3)")


@pytest.fixture
def probes(monkeypatch, tmp_path):
    """An AMX build; the child the check runs is ``probes.command`` (each run counted)."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOCALSPEC_TRUST_AMX", raising=False)
    monkeypatch.setattr(llama_build, "installed_system_info", lambda: AMX_BUILD)

    class Probes:
        command = CRASHES
        runs = 0

    def command(model: Path, *, n_threads: int, n_gpu_layers: int) -> list[str]:
        Probes.runs += 1
        return Probes.command

    monkeypatch.setattr(llama_build, "probe_command", command)
    return Probes


def _model(tmp_path: Path, file_type: int | None = Q4_K_M, name: str = "m.gguf") -> Path:
    return write_gguf(tmp_path / name, file_type=file_type)


def _verdicts() -> list[Path]:
    return sorted((constants.localspec_home() / "amx").glob("*.json"))


def test_a_crash_in_the_probe_is_an_error_with_the_rebuild_command_and_is_kept(probes, tmp_path):
    model = _model(tmp_path)
    with pytest.raises(BuildError) as err:
        llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    text = str(err.value)
    assert "m.gguf" in text and "AMX" in text and "SIGSEGV" in text
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF' in text and "-DGGML_AMX_INT8=OFF" in text
    assert "-DGGML_AVX512=ON" in text  # the rest of the build's features are kept
    assert "LOCALSPEC_TRUST_AMX=1" in text
    assert probes.runs == 1 and len(_verdicts()) == 1
    probes.command = SURVIVES  # the kept verdict decides; no second probe
    with pytest.raises(BuildError):
        llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    assert probes.runs == 1


def test_a_probe_that_survives_is_kept_and_the_load_goes_ahead(probes, tmp_path):
    model = _model(tmp_path)
    probes.command = SURVIVES
    llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    assert probes.runs == 1 and len(_verdicts()) == 1
    model.write_bytes(model.read_bytes() + b"\0" * 64)  # another file (size, mtime): probed again
    probes.command = CRASHES
    with pytest.raises(BuildError):
        llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    assert probes.runs == 2


def test_a_probe_that_fails_otherwise_decides_nothing(probes, tmp_path):
    probes.command = FAILS
    model = _model(tmp_path)
    llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    assert probes.runs == 2 and _verdicts() == []


def test_a_damaged_verdict_is_probed_again(probes, tmp_path):
    model = _model(tmp_path)
    probes.command = SURVIVES
    llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    (kept,) = _verdicts()
    kept.write_text('{"crashed": "maybe"')
    probes.command = CRASHES
    with pytest.raises(BuildError):
        llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    assert probes.runs == 2


@pytest.mark.parametrize("file_type", [0, 1, 32])  # F32, F16, BF16: AMX takes none of them
def test_float_models_and_builds_without_amx_are_never_probed(probes, tmp_path, monkeypatch, file_type):
    llama_build.check_amx(_model(tmp_path, file_type), n_threads=2, n_gpu_layers=0)
    monkeypatch.setattr(llama_build, "installed_system_info", lambda: AVX2_BUILD)
    llama_build.check_amx(_model(tmp_path, Q4_K_M, "q.gguf"), n_threads=2, n_gpu_layers=0)
    assert probes.runs == 0 and _verdicts() == []


def test_trusting_amx_skips_the_probe(probes, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_TRUST_AMX", "1")
    llama_build.check_amx(_model(tmp_path), n_threads=2, n_gpu_layers=0)
    assert probes.runs == 0


def test_a_model_load_and_the_cli_stop_before_llama_cpp_loads_the_model(probes, tmp_path, monkeypatch):
    model = _model(tmp_path)  # no tensors: llama.cpp itself would refuse it, so reaching it fails the test
    with pytest.raises(BuildError):
        Model(model, n_ctx=64, n_threads=1)
    # the embedded target (F16) as if it were quantized: the command line says what to do, in one message
    monkeypatch.setattr(llama_build, "file_type_of", lambda path: Q4_K_M)
    res = CliRunner().invoke(main, ["run", "-d", "none", "--max-tokens", "4", "hi"], prog_name="localspec")
    assert res.exit_code != 0 and "AMX kernels crash" in res.output and "Traceback" not in res.output
    assert "LOCALSPEC_TRUST_AMX" in res.output


def test_the_probe_child_loads_and_decodes_a_real_model():
    """The real child on the embedded target (F16: it decodes on any build)."""
    done = subprocess.run(
        llama_build.probe_command(constants.EMBEDDED_TARGET, n_threads=1, n_gpu_layers=0),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]


def test_cache_info_lists_the_verdicts_and_clear_costs_has_the_check_run_again(probes, tmp_path):
    model = _model(tmp_path)
    with pytest.raises(BuildError) as err:
        llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    assert "localspec cache clear --costs" in str(err.value)
    runner = CliRunner()
    out = runner.invoke(main, ["cache", "info"]).output
    assert "AMX check: 1 verdict(s)" in out and str(llama_build.verdicts_dir()) in out
    res = runner.invoke(main, ["cache", "clear", "--costs"])
    assert res.exit_code == 0 and "Deleted 1 AMX check verdict(s)" in res.output
    assert _verdicts() == [] and "AMX check" not in runner.invoke(main, ["cache", "info"]).output
    probes.command = SURVIVES  # the check runs again and now lets the load go ahead
    llama_build.check_amx(model, n_threads=2, n_gpu_layers=0)
    assert probes.runs == 2
