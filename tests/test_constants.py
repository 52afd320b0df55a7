"""constants.py is the one place that reads the environment, and its docstring lists every variable."""

from __future__ import annotations

import re
from pathlib import Path

from localspec import constants

ROOT = Path(constants.__file__).resolve().parent
READ = re.compile(
    r"""(?:os\.environ\.get|os\.getenv|_env_path)\(\s*["']([A-Z0-9_]+)["']|os\.environ\[["']([A-Z0-9_]+)["']\]"""
)


def _reads(path: Path) -> set[str]:
    return {a or b for a, b in READ.findall(path.read_text(encoding="utf-8"))}


def test_every_variable_read_by_localspec_is_in_the_table():
    table = constants.__doc__ or ""
    read = set().union(*(_reads(p) for p in ROOT.rglob("*.py")))
    assert {"LOCALSPEC_HOME", "HF_TOKEN", "LOCALSPEC_VERBOSE"} <= read
    missing = sorted(v for v in read if f"``{v}``" not in table)
    assert missing == [], f"read but not listed in constants.py's docstring: {missing}"


def test_the_docs_table_lists_every_variable_of_constants_table():
    table = constants.__doc__ or ""
    listed = set(re.findall(r"^``([A-Z0-9_]+)``", table, re.MULTILINE))
    assert {"LOCALSPEC_HOME", "LOCALSPEC_API_KEY", "LLAMA_CPP_LIB_PATH"} <= listed
    page = (ROOT.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    start = page.index("Every variable localspec reads")
    end = page.find("\n\n", page.index("| --- |", start))
    rows = page[start : end if end >= 0 else len(page)]
    missing = sorted(v for v in listed if f"`{v}`" not in rows)
    assert missing == [], f"in constants.py's table but not docs/configuration.md's: {missing}"


def test_the_accessors_follow_the_environment(monkeypatch):
    monkeypatch.delenv("LOCALSPEC_VERBOSE", raising=False)
    assert constants.verbose() is False
    monkeypatch.setenv("LOCALSPEC_VERBOSE", "1")
    assert constants.verbose() is True
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_CUDA=on")
    assert constants.cmake_args() == "-DGGML_CUDA=on"
