"""``bench --wide-target``: the target re-encoded once by llama-quantize and kept in the cache, and the
big-target workloads. llama-quantize itself is stood in for by a script that records its command line and
copies the file (building the real one takes minutes; `localspec bench --peer` builds it beside the peer)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from localspec.bench import wide_target
from localspec.bench.workloads import BIG_TARGET_WORKLOADS, expand_workloads, select_workloads
from localspec.cli import main
from localspec.constants import EMBEDDED_TARGET
from localspec.errors import BenchError
from localspec.llama import programs


@pytest.fixture
def fake_quantize(tmp_path, monkeypatch):
    """A llama-quantize stand-in: appends its argv to calls.txt and copies SRC to OUT."""
    script = tmp_path / "llama-quantize"
    calls = tmp_path / "calls.txt"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncp "$2" "$3"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(programs, "quantize_binary", lambda log=None: script)
    return calls


def test_the_target_is_re_encoded_once_and_reused_while_its_source_is_the_same(tmp_path, fake_quantize):
    source = tmp_path / "target.gguf"
    source.write_bytes(Path(EMBEDDED_TARGET).read_bytes())
    out = wide_target.wide_target(source, "f16")
    assert out.parent == wide_target.wide_dir() and out.name == "target.F16.gguf"
    assert out.read_bytes() == source.read_bytes()
    (call,) = fake_quantize.read_text().splitlines()
    assert call.split()[0] == "--allow-requantize" and call.split()[3] == "F16"
    assert not list(out.parent.glob("*.part"))
    assert wide_target.wide_target(source, "F16") == out
    assert len(fake_quantize.read_text().splitlines()) == 1  # reused
    source.write_bytes(source.read_bytes() + b"\0")  # another file at the same path: made again
    os.utime(source, ns=(1, 1))
    wide_target.wide_target(source, "F16")
    assert len(fake_quantize.read_text().splitlines()) == 2
    assert json.loads(out.with_suffix(".json").read_text())["size"] == source.stat().st_size


def test_a_failing_tool_leaves_no_file_and_says_where_its_log_is(tmp_path, monkeypatch):
    script = tmp_path / "llama-quantize"
    script.write_text("#!/bin/sh\necho 'llama_model_quantize: failed' >&2\nexit 3\n")
    script.chmod(0o755)
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(programs, "quantize_binary", lambda log=None: script)
    with pytest.raises(BenchError, match="exit status 3") as err:
        wide_target.wide_target(EMBEDDED_TARGET, "Q8_0")
    assert "quantize.log" in err.value.hint
    assert "failed" in (wide_target.wide_dir() / "quantize.log").read_text()
    assert not list(wide_target.wide_dir().glob("*.gguf*"))


def test_unknown_types_and_too_little_disk_are_said_before_any_work(tmp_path, fake_quantize, monkeypatch):
    with pytest.raises(BenchError, match="unknown --wide-target type 'Q2_K'"):
        wide_target.wide_target(EMBEDDED_TARGET, "Q2_K")
    monkeypatch.setattr(wide_target, "_expected_bytes", lambda source, t: 10**15)
    with pytest.raises(BenchError, match="needs about 1000000.0 GB") as err:
        wide_target.wide_target(EMBEDDED_TARGET, "F32")
    assert "LOCALSPEC_HOME" in err.value.hint
    assert not fake_quantize.exists()


def test_the_bench_command_needs_a_real_target_for_it():
    res = CliRunner().invoke(main, ["bench", "--wide-target", "F16", "--out", "/nonexistent/x"])
    assert res.exit_code == 2 and "--wide-target needs --target FILE or --preset NAME" in res.output
    res = CliRunner().invoke(main, ["bench", "--wide-target", "Q3", "--target", EMBEDDED_TARGET])
    assert res.exit_code == 2 and "'Q3' is not one of" in res.output


def test_the_big_target_set_is_prompts_where_copying_cannot_help():
    assert expand_workloads(["big-target", "chat", "code"]) == [*BIG_TARGET_WORKLOADS, "code"]
    loaded = select_workloads(["big-target"], limit=None)
    assert [w.name for w in loaded] == list(BIG_TARGET_WORKLOADS)
    for w in loaded:
        assert len(w.prompts) >= 8 and all(p.chat for p in w.prompts)
        assert not any("```" in p.text or "def " in p.text for p in w.prompts)  # nothing to copy from


def test_sigterm_during_the_re_encoding_stops_llama_quantize(tmp_path, monkeypatch):
    """`timeout` sends SIGTERM to localspec alone: llama-quantize went on under init, writing its .part."""
    import signal
    import subprocess
    import sys
    import time

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOCALSPEC_PEER_DIR", str(tmp_path / "peer"))
    tool = programs.build_dir() / "bin" / programs.QUANTIZE  # where the peer build keeps it: found, not built
    tool.parent.mkdir(parents=True)
    pidfile = tmp_path / "quantize.pid"
    tool.write_text(f'#!/bin/sh\necho $$ > {pidfile}\n: > "$3"\nexec sleep 60\n')
    tool.chmod(0o755)
    script = (
        "from localspec.bench.wide_target import wide_target\n"
        f"wide_target({str(EMBEDDED_TARGET)!r}, 'F16', threads=1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    quantize = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)  # to localspec's pid alone, as `timeout` sends it
    assert proc.wait(30) != 0
    for _ in range(100):
        try:
            os.kill(quantize, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(quantize, signal.SIGKILL)
        pytest.fail("llama-quantize went on after localspec was stopped")
    assert not list(wide_target.wide_dir().glob("*.part"))  # and its partial file is gone
