"""Search the whole Hub for drafts that fit a target, reading only remote GGUF headers (no weights).

Not to be confused with :func:`localspec.gguf.scan.find_drafts`, which ranks drafts among files on disk.
Repository ids and file names here come from a remote listing: ids that are not ``org/name`` are
skipped, and nothing found here is written to disk (downloads go through :mod:`localspec.hub.download`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from localspec import constants
from localspec.errors import DownloadError, LocalspecError, OfflineError
from localspec.gguf import meta as gguf_meta
from localspec.gguf import vocab
from localspec.hub.download import (
    SHARD_RE,
    api_client,
    check_hub_revision,
    gguf_listing,
    select_files,
    translate_error,
)
from localspec.hub.presets import REPO_ID_RE


def _offline_error(repo_id: str, variable: str = "HF_HUB_OFFLINE") -> OfflineError:
    """Searching and reading remote headers always needs the Hub: offline mode cannot serve them from the
    cache (the cache holds whole files, never a listing of the Hub)."""
    return OfflineError(
        f"find-draft searches the Hub ({constants.hf_endpoint()}) for drafts of {repo_id}, but {variable} "
        "is set: offline mode makes no network request",
        hint=f"unset {variable} for this command (`env -u {variable} localspec find-draft {repo_id}`); "
        "without a network, `localspec pair TARGET` ranks the drafts among the GGUF files on this machine",
    )


def _check_online(repo_id: str) -> None:
    """Refuse before any request when offline mode is on (as :mod:`localspec.hub.download` reads it)."""
    if constants.hf_offline():
        raise _offline_error(repo_id)


def _translate(exc: Exception, repo_id: str, filename: str | None = None) -> LocalspecError:
    """:func:`localspec.hub.download.translate_error`, except that huggingface_hub's own offline mode (which
    also
    follows TRANSFORMERS_OFFLINE) says that the search needs the Hub, not that the network is down."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    if isinstance(exc, OfflineModeIsEnabled):  # HF_HUB_OFFLINE unset here: TRANSFORMERS_OFFLINE, then
        return _offline_error(repo_id, "HF_HUB_OFFLINE" if constants.hf_offline() else "TRANSFORMERS_OFFLINE")
    error = translate_error(exc, repo_id, filename)
    if error.hint and "HF_HUB_OFFLINE=1" in error.hint:  # a search cannot run from the cache
        error.hint = (
            "check the network (or a proxy / HF_ENDPOINT); the search needs the Hub, and offline "
            "`localspec pair TARGET` ranks the drafts already on this machine"
        )
    return error


def remote_metadata(repo_id: str, filename: str, revision: str | None = None):
    """The GGUF header (key/value section only) of a file on the Hub, read through HTTP range requests."""
    from huggingface_hub import HfFileSystem

    _check_online(repo_id)
    if revision is not None:
        check_hub_revision(repo_id, revision)
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
    ggufs = [n for n in ggufs if not ((m := SHARD_RE.match(n)) and not m["i"].endswith("1"))]
    for quant in _QUANT_PREFERENCE:
        for n in sorted(ggufs):
            if quant in n.lower():
                return n
    return min(ggufs, key=lambda n: sizes.get(n) or 0, default=None)


def search_hub_drafts(
    repo_id: str, *, filename: str | None = None, max_candidates: int = 8
) -> list[DraftCandidate]:
    """Candidate drafts for a target repository: smaller GGUF models of the same author or family.

    Each candidate's vocabulary is compared with the target's from their remote headers (range reads,
    no weights downloaded). Best first: verdict, then same author, then smaller download.
    """
    if not REPO_ID_RE.match(repo_id):
        raise DownloadError(f"{repo_id!r} is not a Hub repository id", hint='write it as "org/name"')
    _check_online(repo_id)
    api = api_client()
    try:
        info = api.model_info(repo_id, files_metadata=True)
    except Exception as exc:
        raise _translate(exc, repo_id) from exc
    t_sizes = {s.rfilename: s.size for s in info.siblings or []}
    t_file = filename or pick_gguf(t_sizes)
    if t_file is None:
        raise DownloadError(
            f"{repo_id} holds no GGUF model; {gguf_listing(t_sizes)}",
            hint="give a repository with .gguf files (names usually end in -GGUF)",
        )
    t_fp = remote_fingerprint(repo_id, t_file)
    t_params = params_from_name(repo_id) or params_from_name(t_file)
    author, family = repo_id.split("/", 1)[0], family_from_name(repo_id)

    seen: dict[str, object] = {}
    try:
        for kwargs in ({"search": family, "author": author}, {"search": family}):
            for m in api.list_models(limit=50, **kwargs):
                if isinstance(m.id, str) and REPO_ID_RE.match(m.id) and m.id != repo_id and m.id not in seen:
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
