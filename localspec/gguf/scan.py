"""Find GGUF models on disk, fingerprint them (with an on-disk cache) and rank drafts for a target.

Where it looks: folders given, else ``localspec.constants.default_scan_dirs()`` (``LOCALSPEC_MODELS``,
the Hugging Face cache, LM Studio, Ollama). HF cache snapshots are symlinks into ``blobs/``: files are
deduplicated by real path. Ollama's blobs (``sha256-...`` without an extension) are found by their magic.

The cache (``<localspec home>/scan-cache.json``) maps a real path to its size, mtime_ns, mode and summary
(no token list), so a rescan of an unchanged folder reads no GGUF at all. Only files that were read are
cached: an error (permission denied, a file cut short) is looked at again on the next scan. A cache file
that does not parse, or holds entries of the wrong shape, is ignored (and rewritten), never an error.
Only regular files are opened (see :func:`localspec.gguf.meta.open_regular`): a FIFO named like an
Ollama blob cannot hang a scan. ``compare`` needs the token
texts, so when two cached fingerprints differ and a verdict is wanted, the vocabularies are read for real
(``ModelInfo.load_vocab``).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path

from localspec import constants
from localspec.errors import GGUFError
from localspec.gguf.meta import is_gguf_file, model_file_stem, read_metadata
from localspec.gguf.vocab import (
    DRAFTER_FILES,
    MAX_MASK_FRACTION,
    MTP_ASSISTANT_ARCHS,
    VOCAB_TYPES,
    PairVerdict,
    VocabInfo,
    compare,
    drafter_misfit,
    fingerprint,
    memory_note,
    mtp_layers,
    type_mismatch,
    usability,
)

CACHE_VERSION = 4  # 2: entries keyed on mode too, errors never cached; 3: memory kind and MTP layers; 4: MTP
# assistants' layers
SWEET_SPOT = (5.0, 20.0)  # target params / draft params
_VERDICT_RANK = {"identical": 0, "compatible": 1, "compatible-with-mask": 2}
_SIZE_WORDS = re.compile(r"[-_. ]?(\d+(\.\d+)?[bBmM]|instruct|chat|base|it|gguf|q\d\w*|f16|bf16)\b", re.I)


@dataclass
class ModelInfo:
    path: str
    name: str | None = None
    architecture: str | None = None
    family: str | None = None
    n_params: int | None = None
    n_vocab: int | None = None
    quant: str | None = None
    size_bytes: int = 0
    fingerprint: str | None = None
    vocab_model: str | None = None  # tokenizer.ggml.model
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None
    usable: bool = False
    unusable_reason: str | None = None
    error: str | None = None
    memory: str | None = None  # a recurrent or hybrid model: how drafts roll back (None: a transformer)
    mtp_declared: int = 0  # MTP (NextN) layers the header declares
    mtp_present: int = 0  # ... and those that carry weights in this file
    vocab: VocabInfo | None = field(default=None, repr=False, compare=False)  # loaded on demand

    @property
    def mtp_note(self) -> str | None:
        """What the file says of MTP (NextN) layers, the drafter some families ship inside the model."""
        if not self.mtp_declared:
            return None
        assistant_for = MTP_ASSISTANT_ARCHS.get(self.architecture or "")
        if assistant_for:
            return f"{self.mtp_present} MTP layers reading a {assistant_for} target's memory (MTP assistant)"
        if not self.mtp_present:
            return f"declares {self.mtp_declared} MTP layer(s), but this quant dropped their weights"
        if self.mtp_present > 1:  # llama.cpp's chained heads
            return f"{self.mtp_present} MTP layers: --strategy mtp drafts with them, one per draft step"
        return f"{self.mtp_present} MTP layer(s): --strategy mtp drafts with them"

    @property
    def fingerprint_short(self) -> str | None:
        return self.fingerprint[:12] if self.fingerprint else None

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "vocab"}
        d["fingerprint_short"] = self.fingerprint_short
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ModelInfo:
        names = {f for f in cls.__dataclass_fields__ if f != "vocab"}
        return cls(**{k: v for k, v in d.items() if k in names})

    def load_vocab(self) -> VocabInfo:
        """The full vocabulary (token texts), read from the file when not loaded yet."""
        if self.vocab is None:
            self.vocab = fingerprint(read_metadata(self.path, tensors=False, merges=False))
        return self.vocab


@dataclass
class RankedDraft:
    model: ModelInfo
    verdict: PairVerdict | None
    fits: bool
    why: str
    score: tuple = ()

    def as_dict(self) -> dict:
        return {
            "path": self.model.path,
            "name": self.model.name,
            "fits": self.fits,
            "why": self.why,
            "verdict": self.verdict.verdict if self.verdict else None,
            "reasons": self.verdict.reasons if self.verdict else [],
            "n_masked": len(self.verdict.masked_ids) if self.verdict else 0,
            "n_params": self.model.n_params,
            "size_bytes": self.model.size_bytes,
        }


# -- one file ------------------------------------------------------------------------------------------
def inspect(path: str | os.PathLike[str]) -> ModelInfo:
    """Read one GGUF: summary, vocabulary (kept in ``.vocab``) and usability. Never raises for a bad file:
    the problem is in ``.error``."""
    p = os.fspath(path)
    info = ModelInfo(path=p, name=model_file_stem(p))
    try:
        info.size_bytes = os.stat(p).st_size
        meta = read_metadata(p, tensors=True, merges=False)
    except GGUFError as exc:
        info.error = exc.message
        info.unusable_reason = "not a readable GGUF file"
        return info
    except OSError as exc:
        info.error = f"{p}: {exc.strerror or exc}"
        return info
    vocab = fingerprint(meta)
    usable, reason = usability(meta)
    info.name = meta.name
    info.architecture = meta.architecture
    info.family = _family(meta.kv, meta.name, meta.architecture)
    info.n_params = meta.n_params or None
    info.n_vocab = vocab.n_vocab or None
    info.quant = meta.quant_label
    info.fingerprint = vocab.fingerprint
    info.vocab_model = vocab.model
    info.bos_id, info.eos_id = vocab.bos_id, vocab.eos_id
    info.add_bos, info.add_eos = vocab.add_bos, vocab.add_eos
    info.usable, info.unusable_reason = usable, reason
    info.memory = memory_note(meta.architecture)
    info.mtp_declared, info.mtp_present = mtp_layers(meta)
    info.vocab = vocab
    return info


def _family(kv: dict, name: str, arch: str | None) -> str | None:
    base = kv.get("general.basename")
    if isinstance(base, str) and base.strip():
        return base.strip().lower()
    stripped = _SIZE_WORDS.sub("", name).strip(" -_.").lower()
    return stripped or arch


# -- many files ----------------------------------------------------------------------------------------
def iter_model_files(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """GGUF files under ``paths`` (files are taken as given), deduplicated by real path, sorted."""
    seen: dict[str, str] = {}
    for root in paths:
        root = os.fspath(root)
        if os.path.isfile(root):
            seen.setdefault(os.path.realpath(root), root)
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") or d == ".ollama")
            for fn in sorted(filenames):
                full = os.path.join(dirpath, fn)
                blob = fn.startswith(("sha256-", "sha256:"))  # Ollama's blob store: no extension
                if fn.lower().endswith(".gguf") or (blob and is_gguf_file(full)):
                    real = os.path.realpath(full)
                    if os.path.isfile(real):
                        seen.setdefault(real, full)
    return sorted(seen.values())


def scan(paths: Iterable[str | os.PathLike[str]] | None = None, *, use_cache: bool = True) -> list[ModelInfo]:
    """Every GGUF under ``paths`` (default: the usual model folders). Bad files carry ``error``."""
    roots = list(paths) if paths is not None else constants.default_scan_dirs()
    files = iter_model_files(roots)
    cache = _load_cache() if use_cache else {}
    out: list[ModelInfo] = []
    dirty = False
    for f in files:
        real = os.path.realpath(f)
        try:
            st = os.stat(real)
        except OSError as exc:
            out.append(ModelInfo(path=f, name=model_file_stem(f), error=f"{f}: {exc.strerror or exc}"))
            continue
        key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "mode": st.st_mode}
        info = _cached_info(cache.get(real), key)
        if info is not None:
            info.path = f
        else:
            info = inspect(f)
            if info.error is None:
                cache[real] = {**key, "info": info.as_dict()}
            else:
                cache.pop(real, None)
            dirty = True
        out.append(info)
    if use_cache and dirty:
        _save_cache(cache)
    return out


def _cached_info(hit: object, key: dict) -> ModelInfo | None:
    """The cached summary if ``hit`` is a sound entry for a file of exactly this size, mtime and mode."""
    if not isinstance(hit, dict) or any(hit.get(k) != v for k, v in key.items()):
        return None
    data = hit.get("info")
    if not isinstance(data, dict) or data.get("error") is not None:
        return None
    try:
        info = ModelInfo.from_dict(data)
    except TypeError:
        return None
    expected: dict[str, type | tuple[type, ...]] = {
        "name": (str, type(None)),
        "n_vocab": (int, type(None)),
        "fingerprint": (str, type(None)),
        "size_bytes": int,
        "usable": bool,
    }
    if not all(isinstance(getattr(info, k), t) for k, t in expected.items()):
        return None
    return info


def cache_path() -> Path:
    return constants.localspec_home() / "scan-cache.json"


def _load_cache() -> dict:
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON, nested absurdly
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    if not isinstance(data.get("files"), dict):
        return {}
    return data["files"]


def _save_cache(files: dict) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".scan-cache.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"version": CACHE_VERSION, "files": files}, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs speed


# -- ranking -------------------------------------------------------------------------------------------
def verdict_for(target: ModelInfo, draft: ModelInfo) -> PairVerdict:
    """``compare`` for two scanned models, reading vocabularies only when the fingerprints cannot decide."""
    if target.vocab_model and draft.vocab_model and target.vocab_model != draft.vocab_model:
        return type_mismatch(target.vocab_model, draft.vocab_model)
    if target.vocab_model != draft.vocab_model or target.n_vocab is None or draft.n_vocab is None:
        if target.vocab is not None and draft.vocab is not None:
            return compare(target.vocab, draft.vocab)
        return compare(target.load_vocab(), draft.load_vocab())
    same_special = (
        target.add_bos == draft.add_bos
        and target.add_eos == draft.add_eos
        and (not target.add_bos or target.bos_id == draft.bos_id)
        and (not target.add_eos or target.eos_id == draft.eos_id)
    )
    if target.fingerprint == draft.fingerprint and same_special:
        kind = VOCAB_TYPES.get(target.vocab_model or "none", target.vocab_model)
        return PairVerdict(
            "identical",
            [
                f"same {kind} tokenizer and the same {target.n_vocab:,} token "
                f"texts (fingerprint {target.fingerprint_short})"
            ],
        )
    too_many = max(256, int(MAX_MASK_FRACTION * draft.n_vocab))
    if draft.n_vocab - target.n_vocab > too_many:
        return PairVerdict(
            "incompatible",
            [
                f"the draft has {draft.n_vocab - target.n_vocab:,} more tokens than the target "
                f"({draft.n_vocab:,} vs {target.n_vocab:,}): far too many ids the target does not know"
            ],
        )
    return compare(target.load_vocab(), draft.load_vocab())


def rank_drafts(target: ModelInfo, candidates: Iterable[ModelInfo]) -> list[RankedDraft]:
    """Drafts that fit ``target`` best first (``fits=True``), then the others with the reason they don't.

    Order: identical vocabulary, then llama.cpp-compatible, then compatible with a mask; within each,
    the same family first, then the size ratio closest to the 5-20x sweet spot.
    """
    fits: list[RankedDraft] = []
    rejected: list[RankedDraft] = []
    t_real = os.path.realpath(target.path)
    for c in candidates:
        if os.path.realpath(c.path) == t_real:
            continue
        if c.error:
            rejected.append(RankedDraft(c, None, False, f"unreadable: {c.error}"))
            continue
        drafter = DRAFTER_FILES.get(c.architecture or "")
        misfit = drafter and drafter_misfit_for(target, c)
        if misfit:
            rejected.append(RankedDraft(c, None, False, misfit))
            continue
        if not c.usable and not drafter:
            rejected.append(RankedDraft(c, None, False, f"cannot run: {c.unusable_reason}"))
            continue
        if target.n_params and c.n_params and c.n_params >= target.n_params:
            sizes = f"{format_params(c.n_params)} vs {format_params(target.n_params)}"
            rejected.append(RankedDraft(c, None, False, f"not smaller than the target ({sizes})"))
            continue
        try:
            v = verdict_for(target, c)
        except GGUFError as exc:
            rejected.append(RankedDraft(c, None, False, f"unreadable: {exc.message}"))
            continue
        if v.verdict == "incompatible":
            rejected.append(RankedDraft(c, v, False, "vocabulary does not fit: " + "; ".join(v.reasons[:2])))
            continue
        same_family = bool(target.family and c.family == target.family)
        ratio = target.n_params / c.n_params if target.n_params and c.n_params else None
        if ratio is None:
            distance, size_why = 9.0, "size ratio unknown"
        else:
            lo, hi = SWEET_SPOT
            distance = 0.0 if lo <= ratio <= hi else abs(math.log(ratio / (lo if ratio < lo else hi)))
            where = (
                "in the 5-20x sweet spot"
                if distance == 0
                else (
                    "too close in size for much speed-up"
                    if ratio < lo
                    else "very small: low acceptance likely"
                )
            )
            size_why = f"{ratio:.1f}x smaller ({where})"
        verdict_why = {
            "identical": "identical vocabulary",
            "compatible": "compatible vocabulary (llama.cpp rule)",
            "compatible-with-mask": f"compatible with {len(v.masked_ids):,} masked ids",
        }[v.verdict]
        family_why = f"same family ({c.family})" if same_family else "different family"
        if drafter:  # made for this target: drafts from its own rows, as its MTP layers do
            family_why = f"{drafter.what} fitting this target (drafts reading its {drafter.reads})"
            size_why = ""
        # a drafter file first: it was trained on the target's own hidden rows
        rank = (0 if drafter else 1, _VERDICT_RANK[v.verdict], 0 if same_family else 1)
        why = "; ".join(w for w in (verdict_why, family_why, size_why) if w)
        fits.append(RankedDraft(c, v, True, why, (*rank, round(distance, 3), c.size_bytes)))
    fits.sort(key=lambda r: r.score)
    return fits + rejected


def drafter_misfit_for(target: ModelInfo, drafter: ModelInfo) -> str | None:
    """Why the drafter file cannot draft for ``target`` (:func:`drafter_misfit` on the two headers; None:
    it can)."""
    try:
        return drafter_misfit(read_metadata(target.path), read_metadata(drafter.path))
    except GGUFError as exc:
        return f"unreadable: {exc.message}"


def find_drafts(
    target_path: str | os.PathLike[str], search_paths: Iterable[str | os.PathLike[str]] | None = None
) -> list[RankedDraft]:
    """Rank every model under ``search_paths`` (default: the target's folder plus the usual model folders)
    as a draft for ``target_path``."""
    target = inspect(target_path)
    if target.error:
        raise GGUFError(os.fspath(target_path), target.error.split(": ", 1)[-1])
    if search_paths is None:
        roots = [str(Path(target_path).resolve().parent), *map(str, constants.default_scan_dirs())]
    else:
        roots = [os.fspath(p) for p in search_paths]
    return rank_drafts(target, scan(roots))


def format_params(n: int | None) -> str:
    if not n:
        return "?"
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)
