"""Fingerprints and pair verdicts on llama.cpp's own test vocabularies, worked out by hand from the rule in
llama.cpp's common/speculative.cpp (same vocab type; add_bos equal and, if set, the same BOS id; the same
for EOS; sizes within 128; token texts equal from id 5 on)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import numpy as np
import pytest
from _gguf_build import load_tokens, synthetic_tokens, vocab_path, write_gguf

from localspec.gguf.meta import read_metadata
from localspec.gguf.vocab import VocabInfo, compare, fingerprint, fingerprint_tokens, usability


@cache
def vocab(name: str) -> VocabInfo:
    return fingerprint(read_metadata(vocab_path(name), tensors=False, merges=False))


def test_fingerprint_is_pinned():
    # The recipe is part of the cache and of what users compare across machines: it must not drift.
    assert vocab("qwen2").short == "cfa5dd10e5f2"
    assert vocab("llama-spm").short == "d25504c9fd1b"
    assert vocab("qwen2").fingerprint == fingerprint_tokens("gpt2", vocab("qwen2").tokens)


def test_fingerprint_ignores_file_details_but_not_texts(tmp_path):
    tokens, types = load_tokens("gpt-2")
    # the same table written by another writer, with another architecture, name and pre-tokenizer
    p = write_gguf(
        tmp_path / "other.gguf",
        arch="starcoder",
        name="x",
        tokens=tokens,
        token_types=types,
        pre="starcoder",
        bos=0,
        eos=0,
    )
    assert fingerprint(read_metadata(p)).fingerprint == vocab("gpt-2").fingerprint
    changed = list(tokens)
    changed[1000] += "!"
    p2 = write_gguf(tmp_path / "changed.gguf", tokens=changed, token_types=types)
    assert fingerprint(read_metadata(p2)).fingerprint != vocab("gpt-2").fingerprint
    # moving a byte between neighbours keeps the concatenation but not the table
    assert fingerprint_tokens("gpt2", ["ab", "c"]) != fingerprint_tokens("gpt2", ["a", "bc"])
    assert fingerprint_tokens("gpt2", ["a"]) != fingerprint_tokens("llama", ["a"])


def test_special_token_facts_follow_llama_cpp_defaults():
    spm = vocab("llama-spm")
    assert (spm.vocab_type, spm.bos_id, spm.eos_id, spm.add_bos, spm.add_eos) == ("SPM", 1, 2, True, False)
    q = vocab("qwen2")  # BPE: no add_bos key, so llama.cpp's BPE default (False) applies
    assert (q.vocab_type, q.bos_id, q.eos_id, q.add_bos) == ("BPE", 151643, 151643, False)


def test_identical_lists_under_different_names():
    # qwen2 and qwen35 files: same 151,936 texts, only tokenizer.ggml.pre differs ("qwen2" vs "qwen35"),
    # which decides how text is split into tokens, not what an id means.
    r = compare(vocab("qwen2"), vocab("qwen35"))
    assert r.verdict == "identical" and not r.masked_ids
    # gpt-neox and mpt: architectures "gptneox" and "mpt", the same GPT-NeoX-20B tokenizer (50,432 tokens).
    assert compare(vocab("gpt-neox"), vocab("mpt")).verdict == "identical"


def test_near_identical_spm_pair_is_compatible():
    # phi-3 is llama's 32,000 SentencePiece tokens plus 64 added ones: ids 0..31999 agree, the size
    # difference (64) is within 128, both add BOS id 1; EOS ids differ (2 vs 32000) but neither adds EOS,
    # so llama.cpp does not compare them.
    r = compare(vocab("llama-spm"), vocab("phi-3"))
    assert r.verdict == "compatible"
    assert r.masked_ids == list(range(32000, 32064))  # draft ids the target does not have
    assert any("64 more tokens" in x for x in r.reasons)
    back = compare(vocab("phi-3"), vocab("llama-spm"))
    assert back.verdict == "compatible" and back.masked_ids == []


@pytest.mark.parametrize(
    "target, draft, needle",
    [
        # gpt-2 has 50,257 tokens, gpt-neox 50,432 (175 more: beyond 128) and reorders ordinary tokens.
        ("gpt-2", "gpt-neox", "175 more tokens"),
        # refact's 49,216 BPE tokens are another list altogether: id 19 is '4' in gpt-2, '!' in refact.
        ("gpt-2", "refact", "token 19 differs: target '4' vs draft '!'"),
        # SentencePiece vs byte-level BPE: the same id is a different kind of string.
        ("llama-spm", "qwen2", "different tokenizer types"),
        ("qwen2", "gpt-2", "token 256 differs"),
    ],
)
def test_plainly_different_vocabularies(target, draft, needle):
    r = compare(vocab(target), vocab(draft))
    assert r.verdict == "incompatible"
    assert any(needle in x for x in r.reasons), r.reasons
    assert not r.usable


# -- compatible-with-mask: a DeepSeek-R1-Distill-Qwen-like vocabulary built from the real Qwen2 list -------
R1_SPECIAL = [
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜begin▁of▁sentence｜>",
    "<|EOT|>",
    "<think>",
    "</think>",
]


@pytest.fixture(scope="module")
def r1(tmp_path_factory) -> VocabInfo:
    """Written once per module: GGUFWriter needs a second or two for 152K tokens."""
    tokens, types = load_tokens("qwen2")
    tokens, types = list(tokens), list(types)
    for i, text in enumerate(R1_SPECIAL):  # ids 151643.. are redefined, as control tokens
        tokens[151643 + i] = text
        types[151643 + i] = 3
    tokens += [f"<|pad_{i}|>" for i in range(128)]  # 152,064 rows, like the 7B+ models
    types += [4] * 128
    path = write_gguf(
        tmp_path_factory.mktemp("r1") / "r1.gguf",
        arch="qwen2",
        tokens=tokens,
        token_types=types,
        bos=151646,
        eos=151643,
        add_bos=True,
        add_eos=False,
    )
    return fingerprint(read_metadata(path))


def test_special_tokens_only_differ_gives_mask(r1):
    qwen = vocab("qwen2")
    assert r1.n_vocab == 152064 and qwen.n_vocab == 151936
    # target R1-distill (152,064), draft Qwen2.5 (151,936): llama.cpp refuses (add_bos differs, texts differ
    # at 151643); every difference is a control token, so the draft just must not propose those ids.
    r = compare(r1, qwen)
    assert r.verdict == "compatible-with-mask", r.reasons
    assert r.masked_ids == list(range(151643, 151643 + len(R1_SPECIAL)))
    assert "ordinary tokens agree" in r.reasons[0]
    assert any("adds BOS" in x for x in r.reasons) and any("llama.cpp" in x for x in r.reasons)
    # the other way round the draft's 128 extra ids must be masked too
    back = compare(qwen, r1)
    assert back.verdict == "compatible-with-mask"
    assert back.masked_ids == [*range(151643, 151643 + len(R1_SPECIAL)), *range(151936, 152064)]


def test_an_ordinary_difference_is_incompatible(r1):
    tokens = list(r1.tokens)
    tokens[1000] = "Ġsomething-else"
    broken = replace(r1, tokens=tokens, fingerprint=fingerprint_tokens(r1.model, tokens))
    r = compare(broken, vocab("qwen2"))
    assert r.verdict == "incompatible"
    assert any("token 1000 differs" in x for x in r.reasons), r.reasons


def test_bos_only_difference_on_same_list(tmp_path):
    toks = synthetic_tokens(300)
    a = fingerprint(read_metadata(write_gguf(tmp_path / "a.gguf", tokens=toks, bos=1, add_bos=True)))
    b = fingerprint(read_metadata(write_gguf(tmp_path / "b.gguf", tokens=toks, bos=1, add_bos=False)))
    assert a.fingerprint == b.fingerprint
    r = compare(a, b)
    assert r.verdict == "compatible-with-mask" and r.masked_ids == []
    assert any("does not add BOS" not in x and "adds BOS" in x for x in r.reasons)
    c = fingerprint(read_metadata(write_gguf(tmp_path / "c.gguf", tokens=toks, bos=2, add_bos=True)))
    assert any("different BOS" in x for x in compare(a, c).reasons)


def test_no_vocabulary(tmp_path):
    empty = fingerprint(read_metadata(write_gguf(tmp_path / "e.gguf")))
    assert empty.fingerprint is None and empty.n_vocab == 0
    r = compare(empty, vocab("gpt-2"))
    assert r.verdict == "incompatible" and "no vocabulary" in r.reasons[0]


# -- usability -------------------------------------------------------------------------------------------
def _model(tmp_path, name, **kw):
    return read_metadata(
        write_gguf(
            tmp_path / f"{name}.gguf",
            tokens=synthetic_tokens(10),
            tensors={"w": np.zeros(4, dtype=np.float32)},
            **kw,
        )
    )


def test_usability(tmp_path):
    assert usability(_model(tmp_path, "ok")) == (True, None)
    assert usability(read_metadata(vocab_path("qwen2")))[1].startswith("vocab-only")
    mmproj = _model(tmp_path, "mm", arch="clip", extra=lambda w: w.add_string("general.type", "mmproj"))
    ok, why = usability(mmproj)
    assert not ok and "mmproj" in why
    ok, why = usability(
        _model(
            tmp_path, "shard", extra=lambda w: (w.add_uint16("split.no", 1), w.add_uint16("split.count", 3))
        )
    )
    assert not ok and "shard 2 of 3" in why and "first shard" in why
    # recurrent and hybrid models speculate: their memory rolls back through snapshots or checkpoints
    for arch in ("mamba", "rwkv7", "jamba", "qwen3next", "qwen35", "lfm2", "granitehybrid", "minimax-01"):
        assert usability(_model(tmp_path, arch, arch=arch)) == (True, None), arch
    assert usability(_model(tmp_path, "q3", arch="qwen3"))[0]
    # drafter files draft for a target: as a model of their own they are refused by name, with the way in
    for arch, name in (("eagle3", "EAGLE-3"), ("dflash", "DFlash")):
        ok, why = usability(_model(tmp_path, arch, arch=arch))
        assert not ok and name in why and "--draft" in why, arch
        assert usability(_model(tmp_path, arch, arch=arch), role="draft") == (True, None)
    # an MTP assistant drafts for its target, never runs as a model of its own
    assistant = _model(tmp_path, "assistant", arch="gemma4-assistant")
    ok, why = usability(assistant)
    assert not ok and "MTP assistant" in why and "gemma4 target" in why and "--draft" in why
    assert usability(assistant, role="draft") == (True, None)


def test_memory_note_names_how_drafts_roll_back():
    from localspec.gguf.vocab import memory_note

    assert memory_note("qwen2") is None and memory_note(None) is None
    assert memory_note("qwen35") == "hybrid (recurrent layers): drafts roll back through state snapshots"
    assert memory_note("jamba") == "hybrid (recurrent layers): drafts roll back through state checkpoints"
    assert memory_note("mamba2") == "recurrent: drafts roll back through state checkpoints"


def test_mtp_layers_declared_and_present(tmp_path):
    from localspec.gguf.vocab import mtp_layers

    def header(name, with_weights):
        tensors = {"token_embd.weight": np.zeros((4, 8), np.float32)}
        if with_weights:
            tensors["blk.2.nextn.eh_proj.weight"] = np.zeros((4, 8), np.float32)
        path = write_gguf(
            tmp_path / name,
            arch="qwen35",
            tokens=["a", "b"],
            tensors=tensors,
            extra=lambda w: w.add_uint32("qwen35.nextn_predict_layers", 1),
        )
        return read_metadata(path)

    assert mtp_layers(header("mtp.gguf", True)) == (1, 1)
    assert mtp_layers(header("dropped.gguf", False)) == (1, 0)  # a quant that left the MTP weights out
    assert mtp_layers(_model(tmp_path, "plain", arch="qwen3")) == (0, 0)


# The pair check (localspec.gguf.pairing) on top of the verdict


def _runnable(path, tokens, n_embd=4):
    from _gguf_build import tiny_model

    return tiny_model(path, tokens, n_embd=n_embd, basename="Fam")


def test_an_incompatible_pair_is_refused_with_its_advice_said_once(tmp_path):
    from localspec.errors import IncompatiblePairError
    from localspec.gguf.pairing import check_pair

    target = _runnable(tmp_path / "t.gguf", synthetic_tokens(200), n_embd=40)
    draft = _runnable(tmp_path / "d.gguf", synthetic_tokens(200, prefix="other"))
    assert (
        compare(
            fingerprint(read_metadata(target, merges=False)), fingerprint(read_metadata(draft, merges=False))
        )
        .reasons[-1]
        .startswith("pick a draft whose vocabulary matches")
    )  # `pair` shows it among the reasons
    with pytest.raises(IncompatiblePairError) as info:
        check_pair(target, draft)
    text = str(info.value)
    assert "differs" in text and info.value.reasons  # why it does not fit
    assert text.count("--draft ngram") == 1 and "pick a draft whose vocabulary matches" not in text
    assert info.value.hint and "--draft ngram" in info.value.hint


def test_the_pair_check_warns_when_the_draft_is_not_smaller(tmp_path):
    from localspec.gguf.pairing import check_pair, size_warning

    toks = synthetic_tokens(200)
    big = _runnable(tmp_path / "big.gguf", toks, n_embd=40)
    small = _runnable(tmp_path / "small.gguf", toks)
    assert check_pair(big, small).warnings == []
    swapped = check_pair(small, big)
    assert swapped.verdict == "identical"  # the vocabulary verdict is unchanged
    (warning,) = swapped.warnings
    assert "is larger than the target" in warning and "may be swapped" in warning
    assert size_warning(1_200_000_000, 400_000_000) is None
    assert size_warning(400_000_000, 1_200_000_000, order="TARGET first, then DRAFT") == (
        "the draft (1.2 GB) is larger than the target (400 MB): the arguments may be swapped "
        "(TARGET first, then DRAFT)"
    )
    assert "as large as" in (size_warning(5, 5) or "") and size_warning(None, 5) is None
    # a model split into shards: its first file is not the model's size, so no word
    shard = tmp_path / "big-00001-of-00003.gguf"
    shard.write_bytes(small.read_bytes())
    assert check_pair(shard, big).warnings == []
