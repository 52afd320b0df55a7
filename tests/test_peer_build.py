"""The peer's build of llama.cpp programs across processes: two commands that need one at once (a script
starting one ``localspec rpc-server`` per port on a machine with none built) take turns, and the second
uses what the first built. ``cmake`` is stood in for by a script that fails when another cmake runs in the
same build folder, as two real ones writing the same files would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FAKE_CMAKE = """#!/bin/sh
# a cmake that refuses to run beside another one, and "builds" what it is asked for
mkdir "$FAKE_CMAKE_LOCK" 2>/dev/null || { echo "another cmake runs in this build folder" >&2; exit 1; }
trap 'rmdir "$FAKE_CMAKE_LOCK"' EXIT
sleep 1
if [ "$1" = "-S" ]; then
  mkdir -p "$4" && : > "$4/CMakeCache.txt"
elif [ "$1" = "--build" ]; then
  mkdir -p "$2/bin" && printf '#!/bin/sh\\n' > "$2/bin/$4" && chmod +x "$2/bin/$4"
fi
"""


def test_two_builds_at_once_take_turns(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(FAKE_CMAKE)
    (bin_dir / "cmake").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "LOCALSPEC_PEER_DIR": str(tmp_path / "peer"),
        "FAKE_CMAKE_LOCK": str(tmp_path / "cmake-running"),
    }
    from importlib.metadata import version

    src = tmp_path / "peer" / f"llama.cpp-{version('llama-cpp-python')}" / "src"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("")  # the source is there: nothing to download
    script = "from localspec.llama.programs import rpc_server_binary\nprint(rpc_server_binary(log=print))\n"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    built = {out.strip().splitlines()[-1] for out, _ in outs}
    assert len(built) == 1 and Path(built.pop()).is_file()
    said = "".join(out for out, _ in outs)
    assert said.count("building ggml-rpc-server") == 1  # one built; the other waited and found it


def test_a_build_killed_with_its_parent_takes_its_compilers_with_it(tmp_path):
    """SIGKILL leaves localspec no time to stop its build: the kernel's signal stops the whole group."""
    import signal
    import time

    pidfile = tmp_path / "grandchild.pid"
    build = ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]  # make, and a compiler under it
    script = (
        "from localspec.llama.processes import call_as_group\n"
        f"call_as_group({build!r}, cwd=None, stdout=None)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    proc.kill()
    proc.wait(30)
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(grandchild, signal.SIGKILL)
    raise AssertionError("the build's compiler went on after localspec was killed")
