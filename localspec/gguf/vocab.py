"""Vocabulary fingerprints and the draft/target compatibility verdict.

What the fingerprint hashes, and why
------------------------------------
Speculative decoding hands token *ids* from the draft to the target, so what matters is whether an id
means the same text to both models. The fingerprint is SHA-256 over, in this order:

1. the tag ``b"localspec-vocab-v1\\n"`` (a version, so a future change of recipe cannot collide);
2. the tokenizer model (``tokenizer.ggml.model``: ``llama`` = SentencePiece, ``gpt2`` = byte-level BPE,
   ``bert`` = WordPiece, ``t5`` = Unigram...) and ``b"\\n"``: the same strings decode differently under
   different tokenizer models;
3. the number of tokens as a little-endian u64;
4. the length of every token text in code points, as little-endian u32s;
5. all token texts concatenated, UTF-8 encoded (bytes that are not valid UTF-8 are kept as they are).

(3)-(5) are an unambiguous encoding of the id -> text table. Not hashed: merges and the pre-tokenizer
(they only decide how text becomes tokens, which the target does once for the prompt), scores, token
types (they decide how a token is *shown*, not what it is; they are used for the masking verdict
below), and BOS/EOS facts (reported next to the fingerprint and checked by ``compare``). The same
table therefore gives the same fingerprint whatever the file's architecture name, quantisation or
GGUF version.

Verdicts (``compare``)
----------------------
``identical``: same fingerprint and consistent BOS/EOS. ``compatible``: llama.cpp's own rule
(``common_speculative_are_compatible`` in common/speculative.cpp): same vocabulary type; same add_bos
(and, when BOS is added, the same BOS id); the same for EOS; sizes within 128; token texts equal from
id 5 on. ``compatible-with-mask``: the texts differ only on control/user-defined/unused tokens or on ids
the target lacks; the engine can still use the pair if the draft never proposes ``masked_ids``
(DeepSeek-R1-Distill-Qwen vs Qwen2.5 is the classic case). ``incompatible``: anything else.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import TypeGuard

import numpy as np

from localspec.gguf.meta import GGUFMetadata

FINGERPRINT_TAG = b"localspec-vocab-v1\n"
MAX_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE in llama.cpp
CHECK_START_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID in llama.cpp
ORDINARY_TYPES = (1, 6)  # gguf TokenType NORMAL and BYTE; the rest are special in some way
MAX_MASK_FRACTION = 0.05  # more masked ids than this and the pair is called incompatible

VOCAB_TYPES = {
    "llama": "SPM",
    "gpt2": "BPE",
    "bert": "WPM",
    "t5": "UGM",
    "rwkv": "RWKV",
    "plamo2": "PLAMO2",
    "no_vocab": "NONE",
    "none": "NONE",
}
_LLAMA3_LIKE_PRE = {
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "tekken",
    "chameleon",
}

# llama.cpp: llm_arch_is_recurrent, llm_arch_is_hybrid and llm_arch_supports_rs_rollback (src/llama-arch.cpp),
# copied so a header says it before anything loads; tests/test_hybrid.py reads them back from the vendored
# source, so these lists cannot fall behind llama.cpp's. Once loaded, llama.cpp answers per model itself
# (localspec.llama.recurrent). Their memory takes drafts back through state snapshots where llama.cpp keeps
# them (SNAPSHOT_ARCHS), otherwise through checkpoints of the recurrent state.
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
SNAPSHOT_ARCHS = frozenset(
    {
        "kimi-k3",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "glm5-next",
        "nemotron_h",
        "nemotron_h_moe",
        "lfm2",
        "lfm2moe",
        "bailingmoe3",
    }
)


def memory_note(arch: str | None) -> str | None:
    """How an architecture's memory takes rejected drafts back, when it is not a plain KV cache.

    Args:
        arch: ``general.architecture``.

    Returns:
        None for a transformer; else e.g. ``"hybrid (recurrent layers): drafts roll back through state
        snapshots"``.
    """
    if arch not in RECURRENT_ARCHS and arch not in HYBRID_ARCHS:
        return None
    kind = "recurrent" if arch in RECURRENT_ARCHS else "hybrid (recurrent layers)"
    way = "state snapshots" if arch in SNAPSHOT_ARCHS else "state checkpoints"
    return f"{kind}: drafts roll back through {way}"


def mtp_layers(meta: GGUFMetadata) -> tuple[int, int]:
    """MTP (NextN) layers: how many the header declares (``<arch>.nextn_predict_layers``) and how many carry
    weights (``blk.N.nextn.*`` tensors; a quant that dropped them declares layers it no longer has).

    Args:
        meta: a header read with its tensors (without them the second number is 0).

    Returns:
        ``(declared, present)``.
    """
    declared = meta.kv.get(f"{meta.architecture}.nextn_predict_layers")
    declared = declared if isinstance(declared, int) and not isinstance(declared, bool) else 0
    assistant = meta.architecture in MTP_ASSISTANT_ARCHS  # every block of an assistant is an MTP layer
    blocks = {
        t.name.split(".")[1]
        for t in meta.tensors or ()
        if t.name.startswith("blk.") and (assistant or ".nextn." in t.name)
    }
    return max(0, declared), len(blocks)


def mtp_weights_bytes(meta: GGUFMetadata) -> int:
    """Bytes of the MTP layers' weights (the last ``nextn_predict_layers`` blocks; 0 without them).

    Args:
        meta: a header read with its tensors.

    Returns:
        The bytes those blocks' tensors take in the file (what loading them adds).
    """
    declared, present = mtp_layers(meta)
    n_block = meta.kv.get(f"{meta.architecture}.block_count")
    if not present or not isinstance(n_block, int):
        return 0
    first = n_block - declared
    total = 0
    for t in meta.tensors or ():
        parts = t.name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) >= first:
            total += t.n_bytes or 0
    return total


@dataclass
class VocabInfo:
    """A model's vocabulary as llama.cpp would load it, plus its fingerprint."""

    model: str | None  # tokenizer.ggml.model
    pre: str | None  # tokenizer.ggml.pre (not part of the fingerprint)
    tokens: list[str]
    token_types: list[int] | None
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    fingerprint: str | None  # 64 hex digits; None when the file has no vocabulary
    source: str = ""  # file the vocabulary came from

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def vocab_type(self) -> str:
        return VOCAB_TYPES.get(self.model or "none", (self.model or "none").upper())

    @property
    def short(self) -> str | None:
        return self.fingerprint[:12] if self.fingerprint else None

    def text(self, token_id: int | None) -> str:
        if token_id is None or not 0 <= token_id < len(self.tokens):
            return "(none)"
        return _show(self.tokens[token_id])

    def is_ordinary(self, token_id: int) -> bool:
        if self.token_types is None or token_id >= len(self.token_types):
            return True
        return self.token_types[token_id] in ORDINARY_TYPES

    def summary(self) -> dict:
        return {
            "model": self.model,
            "pre": self.pre,
            "vocab_type": self.vocab_type,
            "n_vocab": self.n_vocab,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
            "fingerprint": self.fingerprint,
            "fingerprint_short": self.short,
        }


@dataclass
class PairVerdict:
    verdict: str  # "identical" | "compatible" | "compatible-with-mask" | "incompatible"
    reasons: list[str] = field(default_factory=list)
    masked_ids: list[int] = field(default_factory=list)  # draft ids the draft must never propose

    @property
    def usable(self) -> bool:
        return self.verdict != "incompatible"

    def as_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "masked_ids": list(self.masked_ids),
            "n_masked": len(self.masked_ids),
        }


def fingerprint_tokens(model: str | None, tokens: list[str]) -> str:
    """SHA-256 hex digest of the tokenizer model and the id -> text table (see the module docstring)."""
    h = hashlib.sha256(FINGERPRINT_TAG)
    h.update((model or "").encode("utf-8", "surrogateescape") + b"\n")
    h.update(struct.pack("<Q", len(tokens)))
    h.update(np.fromiter(map(len, tokens), dtype="<u4", count=len(tokens)).tobytes())
    h.update("".join(tokens).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def fingerprint(meta: GGUFMetadata) -> VocabInfo:
    """The vocabulary of a GGUF header, with llama.cpp's defaults for BOS/EOS where keys are missing."""
    kv = meta.kv
    model = _str(kv.get("tokenizer.ggml.model"))
    pre = _str(kv.get("tokenizer.ggml.pre"))
    raw_tokens = kv.get("tokenizer.ggml.tokens")
    # GGUF arrays are homogeneous, so the first item tells whether this is an array of strings
    ok = isinstance(raw_tokens, list) and bool(raw_tokens) and isinstance(raw_tokens[0], str)
    tokens: list[str] = raw_tokens if ok else []  # type: ignore[assignment]
    raw_types = kv.get("tokenizer.ggml.token_type")
    types = raw_types if isinstance(raw_types, list) and len(raw_types) >= len(tokens) else None
    if types is not None and tokens and not _is_int(types[0]):
        types = None

    bos, eos, add_bos, add_eos = _llama_cpp_defaults(model, pre)
    n = len(tokens)
    for key, default in (("tokenizer.ggml.bos_token_id", bos), ("tokenizer.ggml.eos_token_id", eos)):
        val = kv.get(key)
        value = val if _is_int(val) and 0 <= val < n else default
        if key.endswith("bos_token_id"):
            bos = value
        else:
            eos = value
    if isinstance(kv.get("tokenizer.ggml.add_bos_token"), bool):
        add_bos = kv["tokenizer.ggml.add_bos_token"]
    if isinstance(kv.get("tokenizer.ggml.add_eos_token"), bool):
        add_eos = kv["tokenizer.ggml.add_eos_token"]
    fp = fingerprint_tokens(model, tokens) if tokens else None
    return VocabInfo(
        model=model,
        pre=pre,
        tokens=tokens,
        token_types=types,
        bos_id=bos,
        eos_id=eos,
        add_bos=add_bos,
        add_eos=add_eos,
        fingerprint=fp,
        source=meta.path,
    )


def compare(target: VocabInfo | GGUFMetadata, draft: VocabInfo | GGUFMetadata) -> PairVerdict:
    """Can ``draft`` propose tokens for ``target``? A verdict, reasons a person can act on, and the mask."""
    t = target if isinstance(target, VocabInfo) else fingerprint(target)
    d = draft if isinstance(draft, VocabInfo) else fingerprint(draft)
    for side, v in (("target", t), ("draft", d)):
        if not v.tokens:
            return PairVerdict(
                "incompatible",
                [
                    f"the {side} ({_name(v)}) has no vocabulary "
                    f"(no tokenizer.ggml.tokens): it cannot be paired"
                ],
            )
    if t.vocab_type != d.vocab_type:
        return type_mismatch(t.model, d.model)

    special = _special_mismatches(t, d)
    if t.fingerprint == d.fingerprint and not special:
        return PairVerdict(
            "identical",
            [f"same {t.vocab_type} tokenizer and the same {t.n_vocab:,} token texts (fingerprint {t.short})"],
        )
    mism = _mismatching_ids(t.tokens, d.tokens, min(t.n_vocab, d.n_vocab))
    late = [i for i in mism if i >= CHECK_START_ID]
    if not special and abs(d.n_vocab - t.n_vocab) <= MAX_SIZE_DIFFERENCE and not late:
        return _passes_llama_check(t, d, mism)
    return _masked_or_refused(t, d, mism, special)


def _passes_llama_check(t: VocabInfo, d: VocabInfo, mism: list[int]) -> PairVerdict:
    """The verdict for a pair llama.cpp's own check accepts: compatible, ids below its start masked."""
    beyond = list(range(t.n_vocab, d.n_vocab))  # draft ids the target does not have
    size_line = _size_line(t, d)
    reasons: list[str] = [
        "passes llama.cpp's check (common/speculative.cpp): same tokenizer type, BOS/EOS "
        f"consistent, texts equal from id {CHECK_START_ID} on"
    ]
    if size_line:
        reasons.append(size_line)
    if mism:
        reasons.append(
            f"ids below {CHECK_START_ID} differ ({_first(t, d, mism)}); llama.cpp ignores "
            "them, localspec masks them in the draft"
        )
    if t.fingerprint == d.fingerprint:
        reasons.insert(0, f"same token texts (fingerprint {t.short})")
    return PairVerdict("compatible", reasons, sorted(set(mism) | set(beyond)))


def _masked_or_refused(t: VocabInfo, d: VocabInfo, mism: list[int], special: list[str]) -> PairVerdict:
    """The verdict for a pair llama.cpp's check refuses: incompatible when ordinary tokens differ or too
    many ids would need masking, else compatible with those ids masked."""
    n_min = min(t.n_vocab, d.n_vocab)
    diff = d.n_vocab - t.n_vocab
    beyond = list(range(t.n_vocab, d.n_vocab))  # draft ids the target does not have
    late = [i for i in mism if i >= CHECK_START_ID]
    size_line = _size_line(t, d)
    ordinary = [i for i in late if t.is_ordinary(i) and d.is_ordinary(i)]
    masked = sorted(set(mism) | set(beyond))
    reasons = []
    if ordinary:
        reasons.append(
            f"token {ordinary[0]} differs: target {t.text(ordinary[0])} vs draft "
            f"{d.text(ordinary[0])} ({len(ordinary):,} of {n_min:,} shared ids hold different "
            "ordinary tokens); the draft's guesses would mean different text"
        )
    elif len(masked) > max(256, int(MAX_MASK_FRACTION * d.n_vocab)):
        reasons.append(
            f"{len(masked):,} draft ids would have to be masked (more than "
            f"{MAX_MASK_FRACTION:.0%} of the draft's {d.n_vocab:,} tokens)"
        )
    if size_line:
        reasons.append(size_line)
    reasons.extend(special)
    if reasons and (ordinary or len(masked) > max(256, int(MAX_MASK_FRACTION * d.n_vocab))):
        reasons.append(
            "pick a draft whose vocabulary matches (`localspec pair TARGET` lists them), or use --draft ngram"
        )
        return PairVerdict("incompatible", reasons)

    why = []
    if mism:
        why.append(
            f"{len(mism):,} shared ids differ, all special/control tokens (first: {_first(t, d, mism)})"
        )
    if beyond:
        why.append(f"draft ids {beyond[0]}..{beyond[-1]} do not exist in the target")
    bar = (
        f". localspec bars the draft from proposing these {len(masked):,} ids"
        if masked
        else "; no id needs masking"
    )
    reasons.insert(0, "ordinary tokens agree; " + "; ".join(why or ["only BOS/EOS settings differ"]) + bar)
    if special or abs(diff) > MAX_SIZE_DIFFERENCE or late:
        reasons.append(
            "llama.cpp's own check (common/speculative.cpp) refuses this pair; localspec feeds "
            "the target's tokens to the draft, so the pair stays exact, only acceptance may drop"
        )
    return PairVerdict("compatible-with-mask", reasons, masked)


def type_mismatch(target_model: str | None, draft_model: str | None) -> PairVerdict:
    """The verdict for two different tokenizer models (``tokenizer.ggml.model``)."""
    tt = VOCAB_TYPES.get(target_model or "none", str(target_model).upper())
    dt = VOCAB_TYPES.get(draft_model or "none", str(draft_model).upper())
    return PairVerdict(
        "incompatible",
        [
            f"different tokenizer types: the target uses {target_model!r} ({tt}), the draft uses "
            f"{draft_model!r} ({dt}); the same ids mean different text. Pick a draft from the "
            f"target's own family"
        ],
    )


@dataclass(frozen=True)
class DrafterFile:
    """A drafter file that runs only beside its target, in a context linked to the target's."""

    what: str  # for people: "an EAGLE-3 drafter"
    spec_type: str  # llama.cpp's --spec-type for it
    target_arch: str | None  # the one target architecture it drafts for (None: any width-matched target)
    reads: str  # what it reads of the target: "memory" (its KV cache) or "layers" (layers' input rows)


#: Drafter files by ``general.architecture``: they draft for a target (given as its ``--draft``), never as a
#: model of their own. An MTP assistant drafts as the target's MTP layers, reading its KV cache
#: (llama.cpp's draft-mtp with shared memory); EAGLE-3 and DFlash drafters read the input rows of a few
#: target layers (draft-eagle3, draft-dflash).
DRAFTER_FILES = {
    "gemma4-assistant": DrafterFile("an MTP assistant", "draft-mtp", "gemma4", "memory"),
    "eagle3": DrafterFile("an EAGLE-3 drafter", "draft-eagle3", None, "layers"),
    "dflash": DrafterFile("a DFlash drafter", "draft-dflash", None, "layers"),
}

#: MTP assistants (their blocks are all MTP layers), by architecture: the target architecture they draft for.
MTP_ASSISTANT_ARCHS = {a: f.target_arch for a, f in DRAFTER_FILES.items() if f.reads == "memory"}

#: Target architectures whose llama.cpp graph hands out its layers' input rows (what EAGLE-3 and DFlash
#: drafters read), in the llama.cpp llama-cpp-python 0.3.36 vendors (``src/models/*.cpp`` setting
#: ``t_layer_inp``). Any other target would abort llama.cpp, so it is refused before loading.
LAYER_ROWS_ARCHS = frozenset(
    {
        "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2",
        "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35",
        "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp",
    }
)  # fmt: skip


def drafter_misfit(target: GGUFMetadata, drafter: GGUFMetadata) -> str | None:
    """Why the drafter file ``drafter`` (:data:`DRAFTER_FILES`) cannot draft for ``target`` (None: it can):
    one made for another architecture or width, or reading layers the target lacks, would read the target
    as something it is not.

    Args:
        target: the target's header.
        drafter: the drafter file's header.

    Returns:
        The reason, or None.
    """
    arch, t_arch = drafter.architecture or "", target.architecture or ""
    kind = DRAFTER_FILES.get(arch)
    if kind is None:
        return f"{arch or 'this file'} is not a drafter file (an MTP assistant, EAGLE-3 or DFlash drafter)"
    t_width = target.get(f"{t_arch}.embedding_length")
    if kind.reads == "memory":
        if t_arch != kind.target_arch:
            other = t_arch or "of an unknown kind"
            return f"{kind.what} for {kind.target_arch} targets, and this target is {other}"
        width = drafter.get(f"{arch}.embedding_length_out")
        if width != t_width:
            return f"{kind.what} reading hidden rows {width} wide, and this target's are {t_width} wide"
        return None
    if t_arch not in LAYER_ROWS_ARCHS:
        return (
            f"{kind.what} reads the target's layer rows, which llama.cpp does not hand out for "
            f"{t_arch or 'this'} models"
        )
    width = drafter.get(f"{arch}.target_hidden_size" if arch == "eagle3" else f"{arch}.embedding_length")
    if width != t_width:
        return f"{kind.what} for targets {width} wide, and this target is {t_width} wide"
    layers = drafter.get(f"{arch}.target_layers")
    n_layer = target.get(f"{t_arch}.block_count")
    if not isinstance(layers, list) or not layers or not all(_is_int(i) for i in layers):
        return f"{kind.what} without the target layers it reads ({arch}.target_layers) in its header"
    if _is_int(n_layer) and any(not 0 <= i < n_layer for i in layers):
        return f"{kind.what} reading target layers {layers}, and this target has {n_layer}"
    return None


def usability(meta: GGUFMetadata, *, role: str = "model") -> tuple[bool, str | None]:
    """Can this file serve as a model for speculative decoding here? ``(True, None)`` or ``(False, why)``.

    Args:
        meta: the file's header.
        role: ``"draft"`` also accepts a drafter file (:data:`DRAFTER_FILES`), which drafts for its target;
            as a target or a model of its own (``"model"``, ``"target"``) it is refused.
    """
    kv = meta.kv
    arch = meta.architecture or ""
    gtype = _str(kv.get("general.type")) or ""
    if gtype == "mmproj" or arch == "clip" or any(k.startswith("clip.") for k in kv):
        return False, "a vision projector (mmproj), not a language model: load it next to its model"
    if gtype == "adapter" or any(k.startswith("adapter.") for k in kv):
        return False, "a LoRA adapter, not a full model"
    if arch in DRAFTER_FILES and role != "draft":
        kind = DRAFTER_FILES[arch]
        return False, (
            f"{kind.what} (drafts for a {kind.target_arch or 'width-matched'} target, reading its "
            f"{kind.reads}), not a model of its own: give it as the draft of its target (--draft PATH)"
        )
    split_no = kv.get("split.no")
    if _is_int(split_no) and split_no > 0:
        count = kv.get("split.count")
        of = f" of {count}" if _is_int(count) else ""
        return False, (
            f"shard {split_no + 1}{of} of a split model: open the first shard "
            f"(...-00001-of-...gguf), llama.cpp loads the rest"
        )
    if meta.n_tensors == 0 and not isinstance(kv.get("tokenizer.ggml.tokens"), list):
        return False, "no weights and no vocabulary: a GGUF header with nothing a model needs"
    if meta.n_tensors == 0:
        return False, "vocab-only file (no weights): fine for pairing checks, not for generation"
    if not isinstance(kv.get("tokenizer.ggml.tokens"), list):
        return False, "no vocabulary in the file (tokenizer.ggml.tokens missing)"
    return True, None


# -- helpers -------------------------------------------------------------------------------------------
def _llama_cpp_defaults(model: str | None, pre: str | None) -> tuple[int | None, int | None, bool, bool]:
    """(bos, eos, add_bos, add_eos) that llama.cpp assumes before reading the file's own keys."""
    if model == "llama":
        return 1, 2, True, False
    if model == "bert":
        return 101, None, True, False
    if model == "gpt2":
        bos = None if pre in ("glm4", "chatglm-bpe") else 11
        return bos, 11, pre in _LLAMA3_LIKE_PRE, False
    if model == "t5":
        return None, 1, False, True
    if model == "plamo2":
        return 1, 2, False, False
    return None, None, False, False


def _special_mismatches(t: VocabInfo, d: VocabInfo) -> list[str]:
    """llama.cpp's BOS/EOS rule: same add flag, and the same id when the token is added."""
    out = []
    for what, ta, da, tid, did in (
        ("BOS", t.add_bos, d.add_bos, t.bos_id, d.bos_id),
        ("EOS", t.add_eos, d.add_eos, t.eos_id, d.eos_id),
    ):
        if ta != da:
            out.append(
                f"the target {'adds' if ta else 'does not add'} {what} to the prompt, the draft "
                f"{'does' if da else 'does not'} (target {what} {tid} {t.text(tid)}, "
                f"draft {what} {did} {d.text(did)})"
            )
        elif ta and tid != did:
            out.append(f"different {what}: target id {tid} {t.text(tid)}, draft id {did} {d.text(did)}")
    return out


def _mismatching_ids(a: list[str], b: list[str], n: int) -> list[int]:
    if a[:n] == b[:n]:
        return []
    x = np.array(a[:n], dtype=object)
    y = np.array(b[:n], dtype=object)
    return np.flatnonzero(x != y).tolist()


def _size_line(t: VocabInfo, d: VocabInfo) -> str | None:
    diff = d.n_vocab - t.n_vocab
    if not diff:
        return None
    more = "more" if diff > 0 else "fewer"
    limit = "within" if abs(diff) <= MAX_SIZE_DIFFERENCE else "beyond"
    return (
        f"the draft has {abs(diff):,} {more} tokens than the target ({d.n_vocab:,} vs {t.n_vocab:,}; "
        f"{limit} llama.cpp's limit of {MAX_SIZE_DIFFERENCE})"
    )


def _first(t: VocabInfo, d: VocabInfo, ids: list[int]) -> str:
    i = ids[0]
    return f"id {i}: target {t.text(i)} vs draft {d.text(i)}"


def _show(text: str, limit: int = 40) -> str:
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 4] + "...'"


def _name(v: VocabInfo) -> str:
    return v.source or "vocabulary"


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)
