"""The peer's build cache for tests: llama.cpp programs built once from the vendored source (rpc-server,
test-llama-archs) into the user's real cache, or LOCALSPEC_PEER_DIR (a build cache, not state; CI keeps it
between runs), not into the session's isolated LOCALSPEC_HOME, where every session would build them again."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def peer_build_cache() -> Iterator[Path]:
    """While the block runs, LOCALSPEC_PEER_DIR names the real build cache; yields it."""
    saved = os.environ.get("LOCALSPEC_PEER_DIR")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser()
    os.environ["LOCALSPEC_PEER_DIR"] = saved or str(cache / "localspec" / "peer")
    try:
        yield Path(os.environ["LOCALSPEC_PEER_DIR"])
    finally:
        if saved is None:
            os.environ.pop("LOCALSPEC_PEER_DIR", None)
