"""Model pairs from the Hugging Face Hub: resolve a preset's files, fetch them into the cache, check the pair.

Everything goes through ``huggingface_hub`` (``HfApi``, ``hf_hub_download``) into the standard cache
(``HF_HUB_CACHE`` / ``HF_HOME``), so other tools see the files. Endpoint, token, cache and offline mode
are read from the environment at call time through :mod:`localspec.constants`, never from
``huggingface_hub``'s import-time constants. The Hub-wide draft search lives in :mod:`localspec.hub.search`.

What a download guarantees (the installed huggingface_hub, read in its ``file_download.py``): the file is
written to a uniquely named ``<etag>.<random>.incomplete`` file, a dropped connection is resumed with an
HTTP ``Range`` request *within the same process*, and the file is renamed into the cache only when complete.
A killed process leaves its ``.incomplete`` file behind and the next run starts that file again from byte
0; :func:`clean_stale_incomplete` removes such leftovers. Xet storage is switched off for localspec's
downloads (:func:`_plain_http`): files come over plain HTTPS, the path the tests exercise.

Nothing the Hub sends is trusted: revisions are checked before any call (they become paths under
``refs/``), remote file names go through :func:`safe_join` before they touch a local path, and every
downloaded file is hashed and compared with the SHA-256 (LFS) or git SHA-1 the Hub reported; a file that
does not match is deleted, so the next run fetches it again.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from localspec import constants
from localspec.errors import (
    DiskSpaceError,
    DownloadError,
    GatedRepoError,
    LocalspecError,
    ModelNotFoundError,
    OfflineError,
)
from localspec.gguf.pairing import check_pair
from localspec.hub.presets import REPO_ID_RE, HubRef, ModelRef, Preset, get_preset, revision_problem
from localspec.units import format_bytes

Progress = Callable[[str, int, int], None]
SHARD_RE = re.compile(r"^(?P<base>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
STALE_INCOMPLETE_S = 600  # a live download writes every second; a partial file untouched this long is dead


@dataclass
class ResolvedPair:
    """What :func:`ensure_preset` hands the engine: the preset and local paths (first shard if split)."""

    preset: Preset
    target: Path
    draft: Path | None
    verdict: str | None = None  # "identical" | "compatible" | "compatible-with-mask" | None (not checked)
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RemoteFile:
    repo_id: str
    filename: str
    revision: str
    size: int | None
    sha256: str | None = None  # what the listing says for an LFS file
    git_oid: str | None = None  # the git blob SHA-1 the listing gives (the content hash of a small file)


@dataclass
class ResolvedRef:
    """A model reference resolved to concrete files (all shards of a split GGUF, in order)."""

    ref: ModelRef
    files: list[RemoteFile]
    commit: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)


# -------------------------------------------------------------------------------------- small helpers


def disk_free(path: Path) -> int:
    """Free bytes on the disk holding ``path`` (or its nearest existing parent)."""
    for p in [path, *path.parents]:
        if p.exists():
            return shutil.disk_usage(p).free
    return shutil.disk_usage(Path.cwd()).free


def remote_name_problem(name: object) -> str | None:
    """Why a file name from a remote listing may not be joined to a local folder, or None when it may.

    Allowed: relative POSIX paths of plain parts. Refused: absolute paths, ``.``/``..`` parts, empty
    parts, backslashes (a Windows separator), drive letters and control characters.
    """
    if not isinstance(name, str) or not name:
        return "an empty or non-text name"
    if len(name) > 1024:
        return "a name longer than 1024 characters"
    if "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "a backslash or a control character"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "an absolute path"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "an empty, '.' or '..' part"
    return None


def safe_join(folder: Path, name: str) -> Path:
    """``folder / name`` for a name a remote server sent, refused unless it stays inside ``folder``.

    The check is on the names (the cache's snapshot entries are symlinks into ``blobs/``, so resolving
    links would leave the folder by design). Raises :class:`DownloadError` naming the file.
    """
    problem = remote_name_problem(name)
    if problem is None:
        joined = folder / PurePosixPath(name)
        if os.path.normpath(joined).startswith(os.path.normpath(folder) + os.sep):
            return joined
        problem = "a path outside the folder"
    raise DownloadError(
        f"the server listed a file named {name!r}, which is {problem}: refusing to use it under {folder}",
        hint="the repository listing is malformed or hostile; check HF_ENDPOINT and the repository id",
    )


def check_hub_revision(repo_id: str | None, revision: str) -> str:
    """``revision`` if it is a safe branch, tag or commit name, else :class:`DownloadError`."""
    problem = revision_problem(revision)
    if problem:
        raise DownloadError(
            f"{repo_id}: {problem}",
            hint='use a branch or tag name such as "main", or a 40-hex commit id, as the `revision`',
        )
    return revision


def api_client():
    from huggingface_hub import HfApi

    return HfApi(endpoint=constants.hf_endpoint(), token=constants.hf_token(), library_name="localspec")


def _repo_url(repo_id: str) -> str:
    return f"{constants.hf_endpoint()}/{repo_id}"


def select_files(names: list[str], pattern: str) -> list[str]:
    """The files one model consists of: the match for ``pattern`` (case-insensitive glob), all shards.

    Vision projectors (``mmproj``) are skipped unless the pattern asks for them. Raises ``LookupError``
    with the matching candidates when the pattern is ambiguous, and when nothing matches.
    """
    pat = pattern.lower()
    hits = [
        n
        for n in names
        if fnmatch.fnmatchcase(n.lower(), pat) or fnmatch.fnmatchcase(n.lower().rsplit("/", 1)[-1], pat)
    ]
    if "mmproj" not in pat:
        hits = [n for n in hits if "mmproj" not in n.lower()]
    groups: dict[str, list[str]] = {}
    for name in hits:
        m = SHARD_RE.match(name)
        key = f"{m['base'].lower()}-of-{m['n']}" if m else name
        groups.setdefault(key, []).append(name)
    if not groups:
        raise LookupError("no match")
    if len(groups) > 1:
        raise LookupError("ambiguous: " + ", ".join(sorted(groups)))
    key, members = next(iter(groups.items()))
    m = SHARD_RE.match(members[0])
    if not m:
        return members
    base, n = m["base"], int(m["n"])
    want = [f"{base}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    by_lower = {x.lower(): x for x in names}
    missing = [w for w in want if w.lower() not in by_lower]
    if missing:
        raise LookupError(f"split GGUF {base} is missing shard(s): {', '.join(missing)}")
    return [by_lower[w.lower()] for w in want]


def gguf_listing(names_sizes: dict[str, int | None], limit: int = 25) -> str:
    ggufs = sorted(n for n in names_sizes if n.lower().endswith(".gguf"))
    shown = [f"{n} ({format_bytes(names_sizes[n])})" for n in ggufs[:limit]]
    more = f" ... and {len(ggufs) - limit} more" if len(ggufs) > limit else ""
    if not ggufs:
        others = sorted(names_sizes)[:limit]
        return "it holds no .gguf file" + (f" (files: {', '.join(others)})" if others else "")
    return "it holds: " + ", ".join(shown) + more


# -------------------------------------------------------------------------------------- errors


def translate_error(exc: Exception, repo_id: str, filename: str | None = None) -> LocalspecError:
    """huggingface_hub / network errors -> localspec errors with a next step."""
    from huggingface_hub import errors as hf

    what = f"{repo_id}/{filename}" if filename else repo_id
    if isinstance(exc, hf.GatedRepoError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        has_token = constants.hf_token() is not None
        why = (
            "the token in HF_TOKEN has not been granted access yet"
            if has_token or status == 403
            else "no access token was sent"
        )
        return GatedRepoError(
            f"{repo_id} is a gated repository ({status or 'access denied'}): {why}",
            hint=(
                f"open {_repo_url(repo_id)} while logged in and accept its licence terms; then create a read "
                "token at https://huggingface.co/settings/tokens and either set HF_TOKEN=<token> or run "
                "`hf auth login` (older: `huggingface-cli login`)"
            ),
        )
    if isinstance(exc, hf.RevisionNotFoundError):
        return DownloadError(
            f"{what}: that revision does not exist", hint="check the `revision` in the preset"
        )
    if isinstance(exc, hf.RepositoryNotFoundError):
        return DownloadError(
            f"repository {repo_id} was not found on {constants.hf_endpoint()} (or it is private and no valid "
            "token was sent)",
            hint="check the repository id; for a private repository set HF_TOKEN or run `hf auth login`",
        )
    if isinstance(exc, hf.RemoteEntryNotFoundError):
        return DownloadError(f"{what} does not exist", hint="check the file name in the preset")
    if isinstance(exc, hf.LocalEntryNotFoundError) or _is_network_error(exc):
        return DownloadError(
            f"cannot reach {constants.hf_endpoint()} to fetch {what} ({type(exc).__name__}: {exc})",
            hint="check the network (or a proxy / HF_ENDPOINT); with the files already cached, "
            "set HF_HUB_OFFLINE=1",
        )
    if isinstance(exc, hf.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        said = str(exc).split("\n")[0]  # (httpx appends a line of "For more information check: <MDN>")
        if isinstance(status, int) and 400 <= status < 500 and status != 429:
            return DownloadError(
                f"{what}: {constants.hf_endpoint()} answered {status}: {said}",
                hint="check the repository id, file name and revision, and HF_ENDPOINT if you set it; "
                "retrying will not change the answer",
            )
        return DownloadError(f"{what}: the Hub answered with an error: {said}", hint="try again later")
    return DownloadError(
        f"{what}: download failed: {exc}", hint="run the command again: the files already downloaded are kept"
    )


def _is_network_error(exc: Exception) -> bool:
    import importlib

    try:
        httpx_mod = importlib.import_module("httpx2")  # huggingface_hub >= 2.x
    except ImportError:  # pragma: no cover
        httpx_mod = importlib.import_module("httpx")
    return isinstance(exc, (httpx_mod.TransportError, ConnectionError, TimeoutError))


# -------------------------------------------------------------------------------------- resolving


def _hub_parts(ref: ModelRef) -> tuple[str, str, str]:
    """``(repo_id, filename pattern, revision)`` of a Hub reference, the revision checked."""
    if not isinstance(ref, HubRef):
        raise DownloadError(f"{ref.describe()} is not a Hub file reference", hint="give a repo and a file")
    return ref.repo_id, ref.filename, check_hub_revision(ref.repo_id, ref.revision)


def resolve_remote(ref: ModelRef) -> ResolvedRef:
    """Ask the Hub which files a Hub reference stands for, with their sizes and the commit."""
    repo_id, pattern, revision = _hub_parts(ref)
    try:
        info = api_client().model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:
        raise translate_error(exc, repo_id) from exc
    siblings = {s.rfilename: s for s in info.siblings or [] if isinstance(s.rfilename, str)}
    sizes = {name: s.size for name, s in siblings.items()}
    try:
        names = select_files(list(sizes), pattern)
    except LookupError as exc:
        raise DownloadError(
            f"{repo_id}@{revision}: no single model matches '{pattern}' ({exc}); " + gguf_listing(sizes),
            hint="fix the `file` pattern in the preset (patterns are case-insensitive globs)",
        ) from None
    files = []
    for n in names:
        safe_join(Path("snapshot"), n)  # refuse a hostile name before it is used anywhere
        sib = siblings[n]
        lfs_sha = getattr(sib.lfs, "sha256", None) if sib.lfs else None
        files.append(RemoteFile(repo_id, n, revision, sib.size, lfs_sha, sib.blob_id))
    commit = info.sha if isinstance(info.sha, str) and _COMMIT.match(info.sha) else None
    return ResolvedRef(ref, files, commit)


def _repo_cache_dir(repo_id: str | None) -> Path:
    if not isinstance(repo_id, str) or not REPO_ID_RE.match(repo_id):
        raise DownloadError(f"{repo_id!r} is not a Hub repository id", hint='write it as "org/name"')
    return constants.hf_hub_cache() / ("models--" + repo_id.replace("/", "--"))


def _cached_commit(repo_id: str, revision: str) -> str | None:
    check_hub_revision(repo_id, revision)
    if _COMMIT.match(revision):
        return revision
    ref_file = _repo_cache_dir(repo_id) / "refs" / revision
    try:
        commit = ref_file.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return commit if _COMMIT.match(commit) else None


def cached_paths(resolved: ResolvedRef) -> list[Path | None]:
    """For each file, its path in the local cache snapshot, or None when it is not (fully) there."""
    repo_id, _, revision = _hub_parts(resolved.ref)
    commit = resolved.commit or _cached_commit(repo_id, revision)
    if commit is None:
        return [None] * len(resolved.files)
    snap = _repo_cache_dir(repo_id) / "snapshots" / commit
    paths = [safe_join(snap, f.filename) for f in resolved.files]
    return [p if p.is_file() else None for p in paths]


def resolve_cached(ref: ModelRef, preset: str = "PRESET") -> list[Path]:
    """Resolve a Hub reference from the cache only (offline); raises OfflineError naming what is missing
    (and, in its hint, the ``preset`` to download)."""
    repo_id, pattern, revision = _hub_parts(ref)
    commit = _cached_commit(repo_id, revision)
    snap = _repo_cache_dir(repo_id) / "snapshots" / (commit or "-")
    names = (
        [str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file()] if commit and snap.is_dir() else []
    )
    try:
        chosen = select_files(names, pattern)
    except LookupError:
        raise OfflineError(
            f"HF_HUB_OFFLINE is set and {repo_id}@{revision}/{pattern} is not in the cache "
            f"({constants.hf_hub_cache()})",
            hint=f"unset HF_HUB_OFFLINE and run `localspec download {preset}` with network access, "
            "or copy a Hugging Face cache that holds the files",
        ) from None
    return [safe_join(snap, n) for n in chosen]


# -------------------------------------------------------------------------------------- downloading


def _progress_bar_class(progress: Progress | None, stage: str, base: list[int], total: int):
    """A huggingface_hub tqdm subclass: draws the usual terminal bar and feeds ``progress``."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class _Bar(hf_tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._ls_done = int(kwargs.get("initial") or 0)

        def update(self, n=1):
            self._ls_done += int(n or 0)
            if progress is not None:
                progress(stage, base[0] + self._ls_done, total)
            return super().update(n)

        def close(self):
            base[0] += self._ls_done
            self._ls_done = 0
            super().close()

    return _Bar


def _plain_http() -> None:
    """Switch huggingface_hub's Xet transfer off (it reads this flag at each download).

    Why: Xet downloads go through the compiled ``hf_xet`` client with its own protocol, which the local
    test Hub cannot exercise; plain HTTPS (resumable within a process, checked here by hash) is the one
    path localspec tests. The real Hub serves every Xet-stored file over plain HTTPS as well.
    """
    from huggingface_hub import constants as hf_constants

    hf_constants.HF_HUB_DISABLE_XET = True


def download_file(remote: RemoteFile, *, tqdm_class=None) -> Path:
    """Fetch one file into the cache with ``hf_hub_download``, then check its hash (see :func:`verify_file`).

    Resumes a dropped connection within this call. ``KeyboardInterrupt`` is never caught: huggingface_hub
    deletes its partial file and the interrupt reaches the caller (the CLI exits 130).
    """
    from huggingface_hub import errors as hf
    from huggingface_hub import hf_hub_download

    check_hub_revision(remote.repo_id, remote.revision)
    safe_join(Path("snapshot"), remote.filename)
    _plain_http()
    try:
        path = Path(
            hf_hub_download(
                remote.repo_id,
                remote.filename,
                revision=remote.revision,
                cache_dir=constants.hf_hub_cache(),
                endpoint=constants.hf_endpoint(),
                token=constants.hf_token(),
                library_name="localspec",
                tqdm_class=tqdm_class,
            )
        )
    except hf.RemoteEntryNotFoundError as exc:
        listing = _listing_for_error(remote.repo_id, remote.revision)
        raise DownloadError(
            f"{remote.repo_id}@{remote.revision} has no file {remote.filename} (404); {listing}",
            hint='check the file name (or use a pattern such as "*Q4_K_M.gguf")',
        ) from exc
    except LocalspecError:
        raise
    except Exception as exc:
        raise translate_error(exc, remote.repo_id, remote.filename) from exc
    snapshots = _repo_cache_dir(remote.repo_id) / "snapshots"
    if not os.path.normpath(path).startswith(os.path.normpath(snapshots) + os.sep):
        raise DownloadError(
            f"{remote.repo_id}/{remote.filename}: huggingface_hub returned {path}, outside {snapshots}",
            hint="check HF_HUB_CACHE; this should not happen",
        )
    verify_file(path, remote)
    return path


def _digest(path: Path, algo: str, prefix: bytes = b"") -> str:
    h = hashlib.new(algo, prefix)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def expected_hashes(path: Path, remote: RemoteFile) -> tuple[str | None, str | None]:
    """``(sha256, git_sha1)`` the Hub reported for a downloaded file: from the listing, else the blob name.

    huggingface_hub names a blob after the file's ETag: the SHA-256 (``X-Linked-Etag``) for an LFS file,
    the git blob SHA-1 for a small one.
    """
    blob = os.path.basename(os.path.realpath(path))
    sha256 = remote.sha256 or (blob if _HEX64.match(blob) else None)
    git_oid = remote.git_oid or (blob if _COMMIT.match(blob) else None)
    return sha256, git_oid


def verify_file(path: Path, remote: RemoteFile) -> None:
    """Hash a downloaded file and compare with what the Hub reported; on a mismatch delete it and raise.

    An LFS file (``sha256`` known) is checked against its SHA-256; any other against its git blob SHA-1
    when the Hub gave one. A file that does not match (or whose check is interrupted) is removed, blob
    and snapshot link, so the next run downloads it again.
    """
    sha256, git_oid = expected_hashes(path, remote)
    try:
        if sha256:
            algo, want = "SHA-256", sha256
            got = _digest(path, "sha256")
        elif git_oid:
            algo, want = "git SHA-1", git_oid
            got = _digest(path, "sha1", f"blob {os.path.getsize(path)}\0".encode())
        else:
            return
    except BaseException:
        _remove_cached(path)
        raise
    if got != want.lower():
        _remove_cached(path)
        raise DownloadError(
            f"{remote.repo_id}/{remote.filename}: the downloaded file is corrupt ({algo} {got[:16]}..., "
            f"the Hub reported {want[:16]}...); it was deleted from the cache",
            hint="run the command again to download it again; if it fails the same way, the server or a "
            "proxy in between (HF_ENDPOINT) serves wrong bytes",
        )


def _remove_cached(path: Path) -> None:
    """Delete a snapshot entry and the blob it points to (both stay inside the cache)."""
    blob = Path(os.path.realpath(path))
    for p in (blob, path):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def clean_stale_incomplete(repo_id: str, *, older_than_s: float = STALE_INCOMPLETE_S) -> list[Path]:
    """Delete ``*.incomplete`` files a killed download left in the repository's ``blobs/`` folder.

    Only files not written for ``older_than_s`` seconds go: a download running in another process keeps
    its own file fresh. Returns what was removed.
    """
    blobs = _repo_cache_dir(repo_id) / "blobs"
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(blobs))
    except OSError:
        return removed
    for e in entries:
        try:
            if e.name.endswith(".incomplete") and e.is_file(follow_symlinks=False):
                if now - e.stat(follow_symlinks=False).st_mtime > older_than_s:
                    os.unlink(e.path)
                    removed.append(Path(e.path))
        except OSError:
            continue
    return removed


def _listing_for_error(repo_id: str, revision: str) -> str:
    try:
        files = api_client().list_repo_tree(repo_id, revision=revision, recursive=True)
        return gguf_listing({f.path: getattr(f, "size", None) for f in files if hasattr(f, "size")})
    except Exception:  # the listing is a courtesy; the 404 itself is what matters
        return "the file list could not be read"


def _fetch_resolved(resolved: ResolvedRef, stage: str, progress: Progress | None) -> Path:
    total = resolved.total_bytes
    base = [0]
    paths = []
    for remote in resolved.files:
        paths.append(download_file(remote, tqdm_class=_progress_bar_class(progress, stage, base, total)))
    if progress is not None:
        progress(stage, total, total)
    return paths[0]


def ensure_preset(name: str, *, progress: Progress | None = None, check: bool = True) -> ResolvedPair:
    """Make the preset's target and draft available locally, downloading what is missing, then check them.

    ``progress(stage, done_bytes, total_bytes)`` is called with stage ``"target"`` or ``"draft"`` while
    downloading and ``"check"`` for the pair check. Raises GatedRepoError, OfflineError, DiskSpaceError,
    DownloadError or IncompatiblePairError with a next step.
    """
    preset = get_preset(name)
    refs = {"target": preset.target, "draft": preset.draft_model}
    local: dict[str, Path | None] = {"target": None, "draft": None}
    remote: dict[str, ResolvedRef] = {}
    for stage, ref in refs.items():
        if ref is None:
            continue
        if ref.is_local:
            if not ref.path or not ref.path.is_file():
                raise ModelNotFoundError(
                    f"preset '{name}': {stage} file {ref.path} does not exist",
                    hint="reinstall localspec (its embedded files are missing)"
                    if ref.kind == "embedded"
                    else f"fix the `path` of the preset's {stage} (in {preset.source})",
                )
            local[stage] = ref.path
        elif constants.hf_offline():
            local[stage] = resolve_cached(ref, name)[0]
        else:
            remote[stage] = resolve_remote(ref)
    # What is already complete in the cache needs no download; the rest must fit on the disk.
    todo: dict[str, ResolvedRef] = {}
    for stage, resolved in remote.items():
        cached = cached_paths(resolved)
        if all(cached):
            local[stage] = cached[0]
            if progress is not None:
                progress(stage, resolved.total_bytes, resolved.total_bytes)
        else:
            todo[stage] = resolved
    if todo:
        missing = [
            f for r in todo.values() for f, p in zip(r.files, cached_paths(r), strict=True) if p is None
        ]
        needed = sum(f.size or 0 for f in missing)
        cache = constants.hf_hub_cache()
        free = disk_free(cache)
        if needed > free:
            raise DiskSpaceError(
                f"not enough free disk space in {cache}: preset '{name}' needs {format_bytes(needed)} "
                f"({len(missing)} file(s)) but only {format_bytes(free)} is free",
                hint="free some space, or point HF_HUB_CACHE (or HF_HOME) to a disk with more room",
            )
        for stage, resolved in todo.items():
            clean_stale_incomplete(resolved.files[0].repo_id)
            local[stage] = _fetch_resolved(resolved, stage, progress)
    assert local["target"] is not None
    pair = ResolvedPair(preset, local["target"], local["draft"])
    if check:
        if progress is not None:
            progress("check", 0, 1)
        info = check_pair(pair.target, pair.draft, label=f"preset '{name}'")
        pair.verdict, pair.reasons = info.verdict, info.reasons
        if progress is not None:
            progress("check", 1, 1)
    return pair


def cached_bytes(ref: ModelRef | None) -> int | None:
    """Bytes of a model's files on this machine (all shards); None when they are not all here (cache
    lookups only, no network)."""
    if ref is None:
        return None
    try:
        paths = [ref.path] if ref.is_local and ref.path else resolve_cached(ref)
        return sum(p.stat().st_size for p in paths if p is not None) if paths else None
    except (DownloadError, OSError):
        return None


def is_cached(preset: Preset) -> bool:
    """Whether every file of the preset is on this machine (cache lookups only, no network)."""
    for ref in (preset.target, preset.draft_model):
        if ref is None:
            continue
        if ref.is_local:
            if not (ref.path and ref.path.is_file()):
                return False
            continue
        try:
            resolve_cached(ref)
        except DownloadError:  # OfflineError, or a cache entry with a name safe_join refuses
            return False
    return True
