"""Model pairs from the Hugging Face Hub: download a preset, check the pair, read remote headers.

Everything goes through ``huggingface_hub`` (``HfApi``, ``hf_hub_download``, ``HfFileSystem``) into the
standard cache (``HF_HUB_CACHE`` / ``HF_HOME``), so other tools see the files. Endpoint, token, cache and
offline mode are read from the environment at call time through :mod:`localspec.constants`, never from
``huggingface_hub``'s import-time constants. huggingface_hub downloads into a uniquely named
``.incomplete`` file, resumes with an HTTP ``Range`` request when the connection drops, and renames the
file into the cache only when complete (it deletes the partial file if the download fails for good).
"""

from __future__ import annotations

import fnmatch
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localspec import constants
from localspec.errors import (
    DiskSpaceError,
    DownloadError,
    GatedRepoError,
    LocalspecError,
    ModelNotFoundError,
    OfflineError,
)
from localspec.pairing import check_pair
from localspec.presets import ModelRef, Preset, get_preset

Progress = Callable[[str, int, int], None]
_SHARD = re.compile(r"^(?P<base>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


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


def format_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _api():
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
        m = _SHARD.match(name)
        key = f"{m['base'].lower()}-of-{m['n']}" if m else name
        groups.setdefault(key, []).append(name)
    if not groups:
        raise LookupError("no match")
    if len(groups) > 1:
        raise LookupError("ambiguous: " + ", ".join(sorted(groups)))
    key, members = next(iter(groups.items()))
    m = _SHARD.match(members[0])
    if not m:
        return members
    base, n = m["base"], int(m["n"])
    want = [f"{base}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    by_lower = {x.lower(): x for x in names}
    missing = [w for w in want if w.lower() not in by_lower]
    if missing:
        raise LookupError(f"split GGUF {base} is missing shard(s): {', '.join(missing)}")
    return [by_lower[w.lower()] for w in want]


def _gguf_listing(names_sizes: dict[str, int | None], limit: int = 25) -> str:
    ggufs = sorted(n for n in names_sizes if n.lower().endswith(".gguf"))
    shown = [f"{n} ({format_bytes(names_sizes[n])})" for n in ggufs[:limit]]
    more = f" ... and {len(ggufs) - limit} more" if len(ggufs) > limit else ""
    if not ggufs:
        others = sorted(names_sizes)[:limit]
        return "it holds no .gguf file" + (f" (files: {', '.join(others)})" if others else "")
    return "it holds: " + ", ".join(shown) + more


# -------------------------------------------------------------------------------------- errors


def _translate(exc: Exception, repo_id: str, filename: str | None = None) -> LocalspecError:
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
        return DownloadError(f"{what}: the Hub answered with an error: {exc}", hint="try again later")
    return DownloadError(
        f"{what}: download failed: {exc}", hint="run the command again; it resumes where possible"
    )


def _is_network_error(exc: Exception) -> bool:
    try:
        import httpx2 as httpx_mod  # huggingface_hub >= 2.x
    except ImportError:  # pragma: no cover
        import httpx as httpx_mod
    return isinstance(exc, (httpx_mod.TransportError, ConnectionError, TimeoutError))


# -------------------------------------------------------------------------------------- resolving


def resolve_remote(ref: ModelRef) -> ResolvedRef:
    """Ask the Hub which files a Hub reference stands for, with their sizes and the commit."""
    try:
        info = _api().model_info(ref.repo_id, revision=ref.revision, files_metadata=True)
    except Exception as exc:
        raise _translate(exc, ref.repo_id) from exc
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    try:
        names = select_files(list(sizes), ref.filename)
    except LookupError as exc:
        raise DownloadError(
            f"{ref.repo_id}@{ref.revision}: no single model matches '{ref.filename}' ({exc}); "
            + _gguf_listing(sizes),
            hint="fix the `file` pattern in the preset (patterns are case-insensitive globs)",
        ) from None
    files = [RemoteFile(ref.repo_id, n, ref.revision, sizes.get(n)) for n in names]
    return ResolvedRef(ref, files, info.sha)


def _repo_cache_dir(repo_id: str) -> Path:
    return constants.hf_hub_cache() / ("models--" + repo_id.replace("/", "--"))


def _cached_commit(repo_id: str, revision: str) -> str | None:
    if _COMMIT.match(revision):
        return revision
    ref_file = _repo_cache_dir(repo_id) / "refs" / revision
    try:
        return ref_file.read_text().strip() or None
    except OSError:
        return None


def cached_paths(resolved: ResolvedRef) -> list[Path | None]:
    """For each file, its path in the local cache snapshot, or None when it is not (fully) there."""
    commit = resolved.commit or _cached_commit(resolved.ref.repo_id, resolved.ref.revision)
    if commit is None:
        return [None] * len(resolved.files)
    snap = _repo_cache_dir(resolved.ref.repo_id) / "snapshots" / commit
    return [(snap / f.filename) if (snap / f.filename).exists() else None for f in resolved.files]


def resolve_cached(ref: ModelRef) -> list[Path]:
    """Resolve a Hub reference from the cache only (offline); raises OfflineError naming what is missing."""
    commit = _cached_commit(ref.repo_id, ref.revision)
    snap = _repo_cache_dir(ref.repo_id) / "snapshots" / (commit or "-")
    names = (
        [str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file()] if commit and snap.is_dir() else []
    )
    try:
        chosen = select_files(names, ref.filename)
    except LookupError:
        raise OfflineError(
            f"HF_HUB_OFFLINE is set and {ref.repo_id}@{ref.revision}/{ref.filename} is not in the cache "
            f"({constants.hf_hub_cache()})",
            hint="unset HF_HUB_OFFLINE and run `localspec download PRESET` with network access, "
            "or copy a Hugging Face cache that holds the files",
        ) from None
    return [snap / n for n in chosen]


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


def download_file(remote: RemoteFile, *, tqdm_class=None) -> Path:
    """Fetch one file into the cache with ``hf_hub_download`` (resumes on dropped connections)."""
    from huggingface_hub import errors as hf
    from huggingface_hub import hf_hub_download

    try:
        return Path(
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
        raise _translate(exc, remote.repo_id, remote.filename) from exc


def _listing_for_error(repo_id: str, revision: str) -> str:
    try:
        files = _api().list_repo_tree(repo_id, revision=revision, recursive=True)
        return _gguf_listing({f.path: getattr(f, "size", None) for f in files if hasattr(f, "size")})
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
                    hint="reinstall localspec (embedded files) or fix the `path` in the preset",
                )
            local[stage] = ref.path
        elif constants.hf_offline():
            local[stage] = resolve_cached(ref)[0]
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


def remote_metadata(repo_id: str, filename: str, revision: str | None = None):
    """The GGUF header (key/value section only) of a file on the Hub, read through HTTP range requests."""
    from huggingface_hub import HfFileSystem

    from localspec import gguf_meta

    fs = HfFileSystem(endpoint=constants.hf_endpoint(), token=constants.hf_token(), skip_instance_cache=True)
    path = f"{repo_id}/{filename}"
    try:
        with fs.open(path, "rb", revision=revision, block_size=gguf_meta.REMOTE_CHUNK) as fh:
            return gguf_meta.read_metadata_fileobj(fh, f"hf://{path}", fh.size, tensors=False)
    except LocalspecError:
        raise
    except FileNotFoundError as exc:
        raise DownloadError(
            f"{path} does not exist on {constants.hf_endpoint()}",
            hint="check the repository id and file name",
        ) from exc
    except Exception as exc:
        raise _translate(exc, repo_id, filename) from exc


def remote_fingerprint(repo_id: str, filename: str, revision: str | None = None):
    """Vocabulary fingerprint of a GGUF on the Hub without downloading its weights."""
    from localspec import vocab

    return vocab.fingerprint(remote_metadata(repo_id, filename, revision))


# -------------------------------------------------------------------------------------- finding drafts

_PARAMS = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)\s*([bm])(?![a-z])", re.IGNORECASE)
_QUANT_PREFERENCE = ("q4_k_m", "q8_0", "q4_0", "q4_k_s", "q5_k_m", "q6_k")
_VERDICT_RANK = {"identical": 0, "compatible": 1, "compatible-with-mask": 2, "incompatible": 3}


@dataclass
class DraftCandidate:
    """One draft found on the Hub for a target, with the verdict read from its remote header."""

    repo_id: str
    filename: str
    download_bytes: int | None
    params: float | None  # parameter count from the repository name (e.g. 0.5e9), None if unknown
    verdict: str  # identical | compatible | compatible-with-mask | incompatible | error
    reasons: list[str] = field(default_factory=list)
    same_author: bool = False

    def as_dict(self) -> dict:
        return {
            "repo_id": self.repo_id,
            "filename": self.filename,
            "download_bytes": self.download_bytes,
            "params": self.params,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "same_author": self.same_author,
        }


def params_from_name(name: str) -> float | None:
    """``Qwen2.5-Coder-0.5B-Instruct`` -> 5e8, ``SmolLM2-135M`` -> 1.35e8 (the last size-like token)."""
    hits = _PARAMS.findall(name.rsplit("/", 1)[-1])
    if not hits:
        return None
    value, unit = hits[-1]
    return float(value) * (1e9 if unit.lower() == "b" else 1e6)


def family_from_name(repo_id: str) -> str:
    """``Qwen/Qwen2.5-Coder-7B-Instruct-GGUF`` -> ``Qwen2.5-Coder`` (the name before the size)."""
    name = repo_id.rsplit("/", 1)[-1]
    m = _PARAMS.search(name)
    base = name[: m.start()] if m else re.sub(r"-?gguf$", "", name, flags=re.IGNORECASE)
    return base.strip("-_. ") or name


def pick_gguf(sizes: dict[str, int | None]) -> str | None:
    """The file a draft would be fetched as: Q4_K_M first, then Q8_0, ...; else the smallest model file."""
    ggufs = [n for n in sizes if n.lower().endswith(".gguf") and "mmproj" not in n.lower()]
    ggufs = [n for n in ggufs if not (_SHARD.match(n) and not _SHARD.match(n)["i"].endswith("1"))]
    for quant in _QUANT_PREFERENCE:
        for n in sorted(ggufs):
            if quant in n.lower():
                return n
    return min(ggufs, key=lambda n: sizes.get(n) or 0, default=None)


def find_drafts(
    repo_id: str, *, filename: str | None = None, max_candidates: int = 8
) -> list[DraftCandidate]:
    """Candidate drafts for a target repository: smaller GGUF models of the same author or family.

    Each candidate's vocabulary is compared with the target's from their remote headers (range reads,
    no weights downloaded). Best first: verdict, then same author, then smaller download.
    """
    from localspec import vocab

    api = _api()
    try:
        info = api.model_info(repo_id, files_metadata=True)
    except Exception as exc:
        raise _translate(exc, repo_id) from exc
    t_sizes = {s.rfilename: s.size for s in info.siblings or []}
    t_file = filename or pick_gguf(t_sizes)
    if t_file is None:
        raise DownloadError(
            f"{repo_id} holds no GGUF model; {_gguf_listing(t_sizes)}",
            hint="give a repository with .gguf files (names usually end in -GGUF)",
        )
    t_fp = remote_fingerprint(repo_id, t_file)
    t_params = params_from_name(repo_id) or params_from_name(t_file)
    author, family = repo_id.split("/", 1)[0], family_from_name(repo_id)

    seen: dict[str, object] = {}
    try:
        for kwargs in ({"search": family, "author": author}, {"search": family}):
            for m in api.list_models(limit=50, **kwargs):
                if m.id != repo_id and m.id not in seen:
                    seen[m.id] = m
    except Exception as exc:
        raise _translate(exc, repo_id) from exc

    def smaller(cand_id: str) -> bool:
        p = params_from_name(cand_id)
        return p is not None and t_params is not None and p < t_params

    cands = [cid for cid in seen if "gguf" in cid.lower() and smaller(cid)]
    cands.sort(key=lambda cid: (cid.split("/", 1)[0] != author, params_from_name(cid) or 0))
    out: list[DraftCandidate] = []
    for cid in cands[:max_candidates]:
        try:
            c_info = api.model_info(cid, files_metadata=True)
            sizes = {s.rfilename: s.size for s in c_info.siblings or []}
            c_file = pick_gguf(sizes)
            if c_file is None:
                continue
            group = select_files(list(sizes), c_file)
            size = sum(sizes.get(n) or 0 for n in group)
            verdict = vocab.compare(t_fp, remote_fingerprint(cid, c_file))
            out.append(
                DraftCandidate(
                    cid,
                    c_file,
                    size,
                    params_from_name(cid),
                    verdict.verdict,
                    list(verdict.reasons),
                    cid.split("/", 1)[0] == author,
                )
            )
        except (LocalspecError, LookupError) as exc:
            out.append(
                DraftCandidate(
                    cid,
                    "",
                    None,
                    params_from_name(cid),
                    "error",
                    [str(exc).splitlines()[0]],
                    cid.split("/", 1)[0] == author,
                )
            )
    out.sort(key=lambda c: (_VERDICT_RANK.get(c.verdict, 9), not c.same_author, c.download_bytes or 0))
    return out


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
        except OfflineError:
            return False
    return True
