"""``localspec doctor``: what the installed llama.cpp can do here, and the rebuild for each gap.

The real build is read on this machine and checked against an independent reading of llama.cpp's system
info and ``/proc/cpuinfo``; other builds (without RPC, with AMX, with CUDA, for another CPU) are described
by hand to :func:`localspec.llama.build.check_build`, the function the command runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from localspec import constants
from localspec.cli import doctor as doctor_cli
from localspec.cli import main
from localspec.llama import build as llama_build
from localspec.llama.build import BuildFacts, Device, check_build, fix_all

AVX2_BUILD = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | REPACK = 1 |"
AMX_BUILD = AVX2_BUILD.replace("BMI2 = 1 |", "BMI2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 |")
AVX2_CPU = "processor\t: 0\nflags\t\t: fpu sse3 ssse3 avx avx2 f16c fma bmi2\n"
AVX512_CPU = AVX2_CPU.replace("bmi2", "bmi2 avx512f avx512_vnni avx_vnni amx_int8 amx_tile")
ARM_CPU = "processor\t: 0\nFeatures\t: fp asimd\n"


def _build(system_info: str = AVX2_BUILD, backends: tuple[str, ...] = ("CPU",), **kw) -> BuildFacts:
    return BuildFacts(version="0.3.36", system_info=system_info, backends=backends, **kw)


def _one(findings, topic: str):
    (found,) = [f for f in findings if f.topic == topic]
    return found


def test_a_build_without_rpc_is_reported_as_a_gap_with_the_rebuild_that_keeps_the_rest():
    findings = check_build(_build(), AVX2_CPU)
    rpc = _one(findings, "RPC")
    assert rpc.state == "gap" and "not built" in rpc.text and "--rpc" in rpc.text
    assert rpc.fix is not None and rpc.fix.startswith('CMAKE_ARGS="-DGGML_NATIVE=OFF ')
    assert "-DGGML_RPC=ON" in rpc.fix and "-DGGML_AVX2=ON" in rpc.fix and "-DGGML_AVX512=OFF" in rpc.fix
    assert rpc.fix.endswith("pip install --no-cache-dir --force-reinstall --no-deps llama-cpp-python==0.3.36")
    with_rpc = _one(check_build(_build(backends=("CPU", "RPC")), AVX2_CPU), "RPC")
    assert with_rpc.state == "ok" and with_rpc.fix is None


def test_an_avx512_cpu_under_an_avx2_build_is_a_gap_and_amx_is_never_advised():
    cpu = _one(check_build(_build(), AVX512_CPU), "CPU features")
    assert cpu.state == "gap" and "AVX512, AVX512_VNNI" in cpu.text and "AVX_VNNI" in cpu.text
    assert (
        "-DGGML_AVX512=ON" in cpu.fix and "-DGGML_AVX512_VNNI=ON" in cpu.fix and "-DGGML_AVX2=ON" in cpu.fix
    )
    assert "-DGGML_AMX_INT8=OFF" in cpu.fix  # this CPU has AMX; its kernels crash on some machines
    assert _one(check_build(_build(), AVX512_CPU), "AMX").state == "ok"


def test_a_feature_the_cpu_lacks_is_a_problem_fixed_by_a_build_without_it():
    findings = check_build(_build(AMX_BUILD), AVX2_CPU)
    cpu = _one(findings, "CPU features")
    assert cpu.state == "problem" and "AVX512, AVX512_VNNI, AMX_INT8" in cpu.text
    assert "-DGGML_AVX512=OFF" in cpu.fix and "-DGGML_AMX_INT8=OFF" in cpu.fix and "-DGGML_AVX2=ON" in cpu.fix


def test_amx_is_a_note_until_the_check_saw_it_crash_then_a_problem():
    note = _one(check_build(_build(AMX_BUILD), AVX512_CPU), "AMX")
    assert note.state == "note" and "20824" in note.text and "-DGGML_AMX_INT8=OFF" in note.fix
    crashed = _one(check_build(_build(AMX_BUILD), AVX512_CPU, amx_crashes=2), "AMX")
    assert crashed.state == "problem" and "2 test decode(s)" in crashed.text
    assert "-DGGML_AVX512=ON" in crashed.fix and "-DGGML_AMX_INT8=OFF" in crashed.fix


def test_gpu_backends_devices_and_a_gpu_the_build_cannot_use():
    cuda = _build(
        backends=("CUDA", "CPU", "RPC"),
        devices=(Device("CUDA0", "NVIDIA H100", "gpu", 80 << 30), Device("CPU", "Xeon", "cpu")),
    )
    found = _one(check_build(cuda, AVX2_CPU, gpus_seen=("CUDA",)), "GPU: CUDA")
    assert found.state == "ok" and "CUDA0 (NVIDIA H100)" in found.text
    # the RPC rebuild of a CUDA build keeps CUDA
    assert "-DGGML_CUDA=on" in _build(backends=("CUDA", "CPU")).flags(add=(llama_build.RPC_FLAG,))
    no_device = _one(check_build(_build(backends=("CUDA", "CPU")), AVX2_CPU), "GPU: CUDA")
    assert no_device.state == "note" and "no device" in no_device.text
    missing = _one(check_build(_build(backends=("CPU", "RPC")), AVX2_CPU, gpus_seen=("CUDA",)), "GPU: CUDA")
    assert missing.state == "gap" and "-DGGML_CUDA=on" in missing.fix and "-DGGML_RPC=ON" in missing.fix
    assert _one(check_build(_build(), AVX2_CPU), "GPU").state == "ok"  # none built, none seen


def test_another_llama_cpp_python_version_is_a_problem_and_every_fix_pins_localspecs():
    findings = check_build(replace_version(_build(), "0.3.20"), AVX2_CPU, pinned="0.3.36")
    version = _one(findings, "llama-cpp-python")
    assert version.state == "problem" and "0.3.20" in version.text
    assert all(f.fix.endswith("llama-cpp-python==0.3.36") for f in findings if f.fix)


def replace_version(build: BuildFacts, version: str) -> BuildFacts:
    return BuildFacts(version, build.system_info, build.backends, build.devices)


def test_one_rebuild_closes_every_gap_at_once():
    build = _build()
    findings = check_build(build, AVX512_CPU, gpus_seen=("CUDA",))
    command = fix_all(build, findings)
    assert command is not None
    flags = re.search(r'CMAKE_ARGS="([^"]*)"', command).group(1).split()
    assert {"-DGGML_AVX512=ON", "-DGGML_RPC=ON", "-DGGML_CUDA=on", "-DGGML_AVX2=ON"} <= set(flags)
    assert len({f.split("=")[0] for f in flags}) == len(flags)  # each option once
    assert fix_all(_build(backends=("CPU", "RPC")), check_build(_build(backends=("CPU", "RPC")), "")) is None
    amx = _build(AMX_BUILD)  # the one rebuild follows the AMX note's own command: AMX off, RPC on
    findings = check_build(amx, AVX512_CPU)
    command = fix_all(amx, findings)
    note = _one(findings, "AMX")
    assert note.state == "note" and "-DGGML_AMX_INT8=OFF" in note.fix
    assert command is not None and "-DGGML_AMX_INT8=OFF" in command and "-DGGML_RPC=ON" in command
    assert "-DGGML_AMX_TILE=OFF" in command and "-DGGML_AVX512=ON" in command  # the rest of the build kept
    assert fix_all(amx, [note]) is None  # a note alone asks for no rebuild


def test_off_x86_the_cpu_is_not_compared():
    arm = _build("CPU : NEON = 1 | ARM_FMA = 1 | DOTPROD = 1 | REPACK = 1 |")
    findings = check_build(arm, ARM_CPU)
    assert not [f for f in findings if f.topic in ("CPU features", "AMX")]
    assert 'CMAKE_ARGS="-DGGML_RPC=ON"' in _one(findings, "RPC").fix


def _independent_reading() -> tuple[set[str], set[str]]:
    """The installed build's features and this CPU's flags, read without localspec's parser."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    built = {m.group(1) for m in re.finditer(r"(\w+) = 1", info)}
    cpuinfo = Path("/proc/cpuinfo")
    flags: set[str] = set()
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return built, flags


def invoke(*args: str):
    return CliRunner().invoke(main, ["doctor", *args], prog_name="localspec")


def test_doctor_names_this_builds_features_and_this_cpus_correctly(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALSPEC_MODELS", str(constants.EMBEDDED_DIR))
    res = invoke("--json")
    report = json.loads(res.stdout)
    assert res.exit_code == (0 if report["ok"] else 1)
    built, flags = _independent_reading()
    rows = {row["name"]: row for row in report["cpu_features"]}
    assert set(rows) == set(llama_build.CPU_FEATURES)
    for name, (flag, _) in llama_build.CPU_FEATURES.items():
        assert rows[name]["build"] == (name in built), name
        assert rows[name]["cpu"] == ((flag in flags) if flags else None), name
    import llama_cpp

    assert report["llama_cpp_python"] == llama_cpp.__version__ and "CPU" in report["backends"]
    rpc = [f for f in report["findings"] if f["topic"] == "RPC"][0]
    assert (rpc["state"] == "ok") == bool(llama_cpp.llama_supports_rpc())
    assert any(d["kind"] == "cpu" for d in report["devices"])
    assert {Path(m["path"]).name for m in report["models"]} >= {"tiny-target.gguf", "tiny-draft.gguf"}
    assert report["paths"]["cache folder (LOCALSPEC_HOME)"] == str(constants.localspec_home())


def test_the_report_for_a_reader_and_its_exit_statuses(monkeypatch):
    monkeypatch.setattr(llama_build, "installed_build", lambda: _build())
    monkeypatch.setattr(llama_build, "gpus_seen", lambda: ())
    monkeypatch.setattr(doctor_cli, "_cpuinfo", lambda: AVX2_CPU)
    monkeypatch.setattr(doctor_cli, "pinned_version", lambda: "0.3.36")
    res = invoke()
    assert res.exit_code == 0, res.output  # a build without RPC works for everything but --rpc
    assert "gap      RPC: not built" in res.output and "-DGGML_RPC=ON" in res.output
    assert "Everything localspec uses works here, with 1 gap(s) above" in res.output
    assert "suffix cache:" in res.output and "measured costs:" in res.output
    monkeypatch.setattr(llama_build, "installed_build", lambda: _build(AMX_BUILD))
    res = invoke()
    assert res.exit_code == 1 and "PROBLEM  CPU features: the build uses AVX512" in res.output

    def broken():
        raise OSError("libllama.so: cannot open shared object file")

    monkeypatch.setattr(llama_build, "installed_build", broken)
    res = invoke("--json")
    report = json.loads(res.stdout)
    assert res.exit_code == 1 and not report["ok"]
    assert (
        "libllama.so" in report["findings"][0]["text"]
        and "llama-cpp-python==0.3.36" in report["findings"][0]["text"]
    )
