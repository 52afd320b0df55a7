"""Shared test setup: isolated cache/config folders, the embedded pair, the optional real Qwen pair."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

QWEN_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


@pytest.fixture(autouse=True, scope="session")
def _isolated_home(tmp_path_factory):
    """Never read or write the user's real localspec cache/config during tests."""
    root = tmp_path_factory.mktemp("localspec-home")
    saved = {k: os.environ.get(k) for k in ("LOCALSPEC_HOME", "LOCALSPEC_CONFIG", "LOCALSPEC_MODELS")}
    os.environ["LOCALSPEC_HOME"] = str(root / "cache")
    os.environ["LOCALSPEC_CONFIG"] = str(root / "config")
    os.environ.pop("LOCALSPEC_MODELS", None)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def embedded_pipe():
    """The embedded pair, loaded once for the whole session (2 threads: CI has 2 cores)."""
    import localspec

    pipe = localspec.load(n_threads=2, n_ctx=1024)
    yield pipe
    pipe.close()


def missing_embedded(paths: list[Path]) -> str | None:
    """Why the test session cannot run, when a file of the embedded pair is missing; None when all are there.

    The embedded pair is tracked in git and shipped in the package: a test that needs it must fail when it
    is gone (a packaging loss), never skip. So the session stops at start with this message, and no test
    needs a skip marker of its own for it.
    """
    gone = [str(p) for p in paths if not p.is_file()]
    if not gone:
        return None
    return (
        f"the embedded model pair is missing ({', '.join(gone)}): it is tracked in git and shipped in the "
        "package, so this is a broken checkout or install: `git checkout -- localspec/embedded` or reinstall"
    )


def pytest_sessionstart(session):
    from localspec.constants import EMBEDDED_DRAFT, EMBEDDED_TARGET

    problem = missing_embedded([EMBEDDED_TARGET, EMBEDDED_DRAFT])
    if problem:
        pytest.exit(problem, returncode=pytest.ExitCode.TESTS_FAILED)


def qwen_dir() -> Path | None:
    d = os.environ.get("LOCALSPEC_QWEN_DIR")
    if d and (Path(d) / QWEN_TARGET).is_file() and (Path(d) / QWEN_DRAFT).is_file():
        return Path(d)
    return None


def pytest_collection_modifyitems(config, items):
    if qwen_dir() is None:
        skip = pytest.mark.skip(
            reason="real Qwen pair not present: python scripts/fetch_qwen_pair.py models && "
            "LOCALSPEC_QWEN_DIR=models pytest -m qwen"
        )
        for item in items:
            if "qwen" in item.keywords:
                item.add_marker(skip)
