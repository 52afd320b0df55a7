"""A folder's text files for the suffix cache's corpus (``localspec index FOLDER``, ``corpus=``)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import CacheError

#: Folders never read for a corpus (besides hidden ones): build output, dependencies, caches.
SKIP_DIRS = frozenset({"node_modules", "__pycache__", "build", "dist", "target", "venv", "site-packages"})
MAX_CORPUS_FILES = 5000
MAX_CORPUS_FILE_BYTES = 1_000_000
MAX_CORPUS_BYTES = 50_000_000


@dataclass
class CorpusScan:
    """Text files found under a folder for the corpus, and what was skipped (reason -> count)."""

    root: Path
    files: list[tuple[str, str]]  # (path relative to root, text)
    skipped: dict[str, int]
    stopped: str | None = None  # why the walk stopped early (a limit), if it did

    @property
    def n_bytes(self) -> int:
        return sum(len(t.encode("utf-8")) for _, t in self.files)


def read_corpus(
    root: str | os.PathLike[str],
    *,
    max_files: int = MAX_CORPUS_FILES,
    max_file_bytes: int = MAX_CORPUS_FILE_BYTES,
    max_bytes: int = MAX_CORPUS_BYTES,
) -> CorpusScan:
    """Text files under ``root`` for the corpus: hidden entries, ``.git``, :data:`SKIP_DIRS`, symlinks,
    binary files (a NUL byte or not UTF-8) and files over ``max_file_bytes`` are skipped; the walk stops
    at ``max_files`` files or ``max_bytes`` bytes. Files come in path order (stable across runs)."""
    base = Path(root).expanduser()
    if not base.exists():
        raise CacheError(f"{base} does not exist", hint="pass the folder of a repository, notes or docs")
    if not base.is_dir():
        raise CacheError(f"{base} is not a folder", hint="pass the folder that holds the files to index")
    skipped: dict[str, int] = {}
    files: list[tuple[str, str]] = []
    total = 0

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    for here, dirs, names in os.walk(base, followlinks=False, onerror=lambda e: skip("unreadable")):
        keep = []
        for d in sorted(dirs):
            if d.startswith(".") or d in SKIP_DIRS:
                skip("hidden or build folder")
            elif os.path.islink(os.path.join(here, d)):
                skip("symlink")
            else:
                keep.append(d)
        dirs[:] = keep
        for name in sorted(names):
            path = os.path.join(here, name)
            rel = os.path.relpath(path, base)
            if name.startswith("."):
                skip("hidden")
                continue
            try:
                st = os.lstat(path)
            except OSError:
                skip("unreadable")
                continue
            if not stat.S_ISREG(st.st_mode):
                skip("symlink or special file")
                continue
            if st.st_size > max_file_bytes:
                skip(f"over {max_file_bytes // 1000} KB")
                continue
            if st.st_size == 0:
                skip("empty")
                continue
            if len(files) >= max_files:
                plural = "s" if max_files > 1 else ""
                return CorpusScan(base, files, skipped, f"stopped at {max_files} file{plural} (--max-files)")
            if total + st.st_size > max_bytes:
                return CorpusScan(base, files, skipped, f"stopped at {max_bytes // 1_000_000} MB (--max-mb)")
            try:
                with open(path, "rb") as fh:
                    raw = fh.read(max_file_bytes + 1)
            except OSError:
                skip("unreadable")
                continue
            if b"\0" in raw[:8192]:
                skip("binary")
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skip("not UTF-8 text")
                continue
            files.append((rel, text))
            total += len(raw)
    return CorpusScan(base, files, skipped)
