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
