"""The scripts under scripts/ that docs tell users to run still start (imports and arguments)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_help_runs(script):
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage" in out.stdout.lower()


def test_the_comparisons_are_bench_options_not_scripts():
    """scripts/ keeps developer tools; the big-target and session comparisons are `localspec bench`'s."""
    from click.testing import CliRunner

    from localspec.cli.bench import bench

    names = {p.name for p in SCRIPTS}
    assert not names & {"bench_big_target.py", "bench_sessions.py", "bench_serve.py", "bench_rpc.py"}
    said = CliRunner().invoke(bench, ["--help"]).output
    for option in (
        "--wide-target",
        "--peer-n-max",
        "--peer-p-min",
        "--sessions",
        "--session-rows",
        "--from-json",
        "--clients",
        "--parallel",
        "--requests",
        "--rpc-rtt",
    ):
        assert option in said, option
