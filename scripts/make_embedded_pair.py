"""Build localspec's embedded default pair: ``tiny-target.gguf`` and ``tiny-draft.gguf``.

Two small llama-architecture models with one shared byte-level BPE tokenizer, trained briefly on CPU on the
Python source files of the CPython standard library of the interpreter running this script (PSF licence). The
draft is trained alongside the target and distilled from it (KL to the target's next-token distributions),
so a speculative run on the pair shows a clearly visible draft acceptance rate.

Needs, for this script only (never at runtime or in tests): ``torch`` (a CPU build is enough),
``tokenizers``, ``gguf`` and ``numpy``; ``llama-cpp-python`` for the export check (torch vs llama.cpp logits).

    python scripts/make_embedded_pair.py                  # trains, writes localspec/embedded/*.gguf, verifies
    python scripts/make_embedded_pair.py --verify-only    # checks the files already there

The defaults (``--steps 700 --distil-steps 100 --batch 16``) are the recipe of the shipped files. The exit
status is 1 when the export check fails (torch and llama.cpp disagree on the logits or the tokenizer), so a
broken export cannot pass silently.

Deterministic: fixed seeds, one torch thread, fixed file and sample order. The same stdlib files (the script
prints their SHA-256) and the same torch build give the same bytes.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import math
import os
import sys
import sysconfig
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers trainer: one thread, be polite on shared CPUs
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "localspec" / "embedded"

# llama.cpp's "smollm" pre-tokenizer: digits split one by one, then GPT-2's split, no space clean-up on
# detokenize. Unlike Qwen2's or Llama 3's split it keeps punctuation and the newline after it apart, so a
# prompt ending in "):" (no newline yet) sits on a token boundary the model saw in training.
PRE_DIGITS = r"\p{N}"
PRE_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
EOS, BOS, SYSTEM, USER, ASSISTANT, END = (
    "<|endoftext|>",
    "<|bos|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
)
SPECIALS = [EOS, BOS, SYSTEM, USER, ASSISTANT, END]
CHAT_TEMPLATE = (  # renders the BOS itself, like Llama 3's; llama.cpp strips it again when it adds one
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
VOCAB_SIZE = 2048
MAX_TOKEN_BYTES = 16  # llama-cpp-python's detokenize uses a 32-byte buffer per token
RMS_EPS = 1e-5
ROPE_BASE = 10000.0
CONTEXT_LENGTH = 2048  # written to GGUF; trained at SEQ_LEN, quality degrades past that
SEQ_LEN = 256
SEED = 1234


@dataclass(frozen=True)
class Config:
    name: str
    n_embd: int
    n_layer: int
    n_head: int
    n_ff: int
    n_vocab: int = VOCAB_SIZE

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


TARGET = Config("localspec-tiny-target", n_embd=160, n_layer=4, n_head=5, n_ff=432)
DRAFT = Config("localspec-tiny-draft", n_embd=64, n_layer=2, n_head=2, n_ff=176)


# ----------------------------------------------------------------------------------------------- data
def stdlib_files(corpus_dir: Path) -> list[tuple[str, str]]:
    """(name, text) of every top-level ``*.py`` file, sorted by name; files that are not UTF-8 are skipped."""
    out = []
    for p in sorted(corpus_dir.glob("*.py")):
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append((p.name, text.replace("\r\n", "\n")))
    return out


def corpus_sha256(files: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for name, text in files:
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def chat_examples(files: list[tuple[str, str]], limit: int = 3000) -> list[str]:
    """Chat-formatted (request, function) pairs from top-level functions with a one-line docstring summary."""
    out = []
    for _, text in files:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            src = ast.get_source_segment(text, node)
            if not doc or not src or len(src) > 1200:
                continue
            summary = doc.strip().splitlines()[0].strip()
            if len(summary) < 10:
                continue
            request = f"Write a Python function {node.name}: {summary}"
            out.append(f"{USER}\n{request}{END}\n{ASSISTANT}\n{textwrap.dedent(src)}{END}\n")
            if len(out) >= limit:
                return out
    return out


def train_tokenizer(texts: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_DIGITS), behavior="isolated", invert=False),
            pre_tokenizers.Split(Regex(PRE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=MAX_TOKEN_BYTES,
    )
    tok.train_from_iterator(texts, trainer)
    for s in SPECIALS:  # special tokens are matched as a whole in the text, like llama.cpp with special=True
        tok.add_special_tokens([s])
    return tok


def vocab_tables(tok) -> tuple[list[str], list[int], list[str]]:
    """Token texts by id, GGUF token types, merges as 'a b' strings."""
    import json

    vocab = tok.get_vocab()
    n = len(vocab)
    assert n == VOCAB_SIZE, n
    tokens = [""] * n
    for text, i in vocab.items():
        tokens[i] = text
    types = [3 if t in SPECIALS else 1 for t in tokens]  # 3 = CONTROL, 1 = NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return tokens, types, merges


def encode_stream(tok, files: list[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """All files as one token stream (each file closed by EOS) and the positions where a line starts."""
    ids: list[int] = []
    starts: list[int] = []
    eos = tok.token_to_id(EOS)
    newline_ids = {i for t, i in tok.get_vocab().items() if t.endswith("Ċ")}  # 'Ċ' is byte 0x0A
    for _, text in files:
        enc = tok.encode(text, add_special_tokens=False).ids
        base = len(ids)
        starts.append(base)
        starts.extend(base + j + 1 for j, t in enumerate(enc[:-1]) if t in newline_ids)
        ids.extend(enc)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64), np.asarray(starts, dtype=np.int64)


# ---------------------------------------------------------------------------------------------- model
def build_model(cfg: Config):
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = cfg.n_embd
            self.attn_norm = nn.Parameter(torch.ones(d))
            self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
            self.ffn_norm = nn.Parameter(torch.ones(d))
            self.gate = nn.Linear(d, cfg.n_ff, bias=False)
            self.up = nn.Linear(d, cfg.n_ff, bias=False)
            self.down = nn.Linear(cfg.n_ff, d, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            h = rms_norm(x, self.attn_norm)
            q = rope(self.q(h).view(b, t, cfg.n_head, cfg.head_dim), cos, sin).transpose(1, 2)
            k = rope(self.k(h).view(b, t, cfg.n_head, cfg.head_dim), cos, sin).transpose(1, 2)
            v = self.v(h).view(b, t, cfg.n_head, cfg.head_dim).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
            h = rms_norm(x, self.ffn_norm)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    def rms_norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w

    def rope(x, cos, sin):
        """llama.cpp's "normal" RoPE: rotate adjacent pairs (x[2i], x[2i+1]) by pos * base^(-2i/head_dim)."""
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cfg = cfg
            self.embd = nn.Embedding(cfg.n_vocab, cfg.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.norm = nn.Parameter(torch.ones(cfg.n_embd))
            self.out = nn.Linear(cfg.n_embd, cfg.n_vocab, bias=False)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = (
                        0.02 / math.sqrt(2 * cfg.n_layer)
                        if name.endswith(("o.weight", "down.weight"))
                        else 0.02
                    )
                    nn.init.normal_(p, std=std)
            inv = ROPE_BASE ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
            ang = torch.arange(CONTEXT_LENGTH, dtype=torch.float64)[:, None] * inv[None, :]
            self.register_buffer("cos", ang.cos().float()[:, None, :], persistent=False)  # (T, 1, D/2)
            self.register_buffer("sin", ang.sin().float()[:, None, :], persistent=False)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.embd(idx)
            for blk in self.blocks:
                x = blk(x, self.cos[:t], self.sin[:t])
            return self.out(rms_norm(x, self.norm))

    return Model()


def _gguf_names(cfg: Config) -> dict[str, str]:
    """torch state_dict key -> GGUF tensor name."""
    names = {"embd.weight": "token_embd.weight", "norm": "output_norm.weight", "out.weight": "output.weight"}
    per_block = {
        "attn_norm": "attn_norm",
        "q.weight": "attn_q",
        "k.weight": "attn_k",
        "v.weight": "attn_v",
        "o.weight": "attn_output",
        "ffn_norm": "ffn_norm",
        "gate.weight": "ffn_gate",
        "up.weight": "ffn_up",
        "down.weight": "ffn_down",
    }
    for i in range(cfg.n_layer):
        names.update({f"blocks.{i}.{k}": f"blk.{i}.{v}.weight" for k, v in per_block.items()})
    return names


def tensors_for_gguf(model) -> dict[str, np.ndarray]:
    """GGUF tensor names -> numpy arrays (torch Linear (out, in) layout is what GGUF's llama expects)."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    return {dst: sd[src] for src, dst in _gguf_names(model.cfg).items()}


def round_to_f16(model) -> None:
    """Round the matrices to what the GGUF stores (F16), so checks compare like with like."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())


# ------------------------------------------------------------------------------------------- training
def special_ids(tok) -> dict[str, int]:
    """The id of each special token in the trained tokenizer (passed on to training and export)."""
    return {s: tok.token_to_id(s) for s in SPECIALS}


def _torch():
    """torch, set up for a deterministic run: one thread, deterministic kernels."""
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    return torch


def train(
    target_steps: int,
    draft_steps_extra: int,
    batch: int,
    stream,
    starts,
    chats,
    ids: dict[str, int],
    log,
) -> tuple:
    """Train target and draft together (the draft learns from the target's soft labels), then distil more."""
    torch = _torch()
    from torch.nn import functional as F

    torch.manual_seed(SEED)
    target, draft = build_model(TARGET), build_model(DRAFT)
    gen = torch.Generator().manual_seed(SEED)
    data = torch.from_numpy(stream)
    starts_t = torch.from_numpy(starts[starts + SEQ_LEN < len(stream)])
    chats_t = [torch.tensor(c[: SEQ_LEN + 1]) for c in chats]
    bos = ids[BOS]

    def batch_xy():
        rows, labels = [], []
        n_chat = int(batch * 0.125)
        pick = starts_t[torch.randint(len(starts_t), (batch - n_chat,), generator=gen)]
        for s in pick.tolist():
            seq = torch.cat((torch.tensor([bos]), data[s : s + SEQ_LEN]))
            rows.append(seq[:-1])
            labels.append(seq[1:])
        for j in torch.randint(len(chats_t), (n_chat,), generator=gen).tolist():
            c = chats_t[j]
            seq = torch.full((SEQ_LEN + 1,), ids[EOS], dtype=torch.long)
            seq[0] = bos
            seq[1 : 1 + min(len(c), SEQ_LEN)] = c[:SEQ_LEN]
            lab = seq[1:].clone()
            lab[len(c) :] = -100
            rows.append(seq[:-1])
            labels.append(lab)
        return torch.stack(rows), torch.stack(labels)

    def schedule(step, total, peak):
        warm = max(1, total // 20)
        if step < warm:
            return peak * (step + 1) / warm
        return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm))))

    opt_t = torch.optim.AdamW(target.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.05)
    opt_d = torch.optim.AdamW(draft.parameters(), lr=4e-3, betas=(0.9, 0.95), weight_decay=0.05)
    total_d = target_steps + draft_steps_extra
    t0 = time.process_time()

    def draft_step(x, y, t_logits, step, mix):
        for g in opt_d.param_groups:
            g["lr"] = schedule(step, total_d, 4e-3)
        d_logits = draft(x)
        mask = y != -100
        hard = F.cross_entropy(d_logits.view(-1, VOCAB_SIZE), y.view(-1), ignore_index=-100)
        kl = (
            F.kl_div(
                F.log_softmax(d_logits, -1), F.log_softmax(t_logits, -1), log_target=True, reduction="none"
            ).sum(-1)
            * mask
        ).sum() / mask.sum()
        loss = (1 - mix) * hard + mix * kl
        opt_d.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt_d.step()
        return hard.item(), kl.item()

    for step in range(target_steps):
        x, y = batch_xy()
        for g in opt_t.param_groups:
            g["lr"] = schedule(step, target_steps, 3e-3)
        logits = target(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB_SIZE), y.view(-1), ignore_index=-100)
        opt_t.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt_t.step()
        mix = min(0.9, 0.9 * step / max(1, target_steps // 2))  # soft labels once the target is worth copying
        d_hard, d_kl = draft_step(x, y, logits.detach(), step, mix)
        if step % 25 == 0 or step == target_steps - 1:
            log(
                f"step {step:4d}  target ce {loss.item():.3f}  draft ce {d_hard:.3f} kl {d_kl:.3f}  "
                f"cpu {time.process_time() - t0:.0f}s"
            )
    target.eval()
    round_to_f16(target)
    for step in range(target_steps, total_d):  # pure distillation from the finished target
        x, y = batch_xy()
        with torch.no_grad():
            t_logits = target(x)
        d_hard, d_kl = draft_step(x, y, t_logits, step, 0.95)
        if step % 25 == 0 or step == total_d - 1:
            log(f"distil {step:4d}  draft ce {d_hard:.3f} kl {d_kl:.3f}  cpu {time.process_time() - t0:.0f}s")
    draft.eval()
    round_to_f16(draft)
    return target, draft


VERIFY_PROMPT = (
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\n"
    "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y  # café, 3.14\n"
    "\tif x  ==  'it''s':\t\tpass   # über 日本 \U0001f600 12345 a ,b ; c .d\n\n\n   \n"
)


# --------------------------------------------------------------------------------------------- export
def write_gguf(path: Path, model, tokens, types, merges, ids: dict[str, int], corpus_hash: str) -> None:
    import gguf

    cfg = model.cfg
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(cfg.name)
    w.add_license("Apache-2.0")
    w.add_description(
        f"localspec embedded {'target' if 'target' in cfg.name else 'draft'} model: "
        "a tiny llama trained on the "
        f"CPython {sys.version_info.major}.{sys.version_info.minor} standard library (PSF-2.0) by "
        f"scripts/make_embedded_pair.py; trained at {SEQ_LEN} tokens; corpus sha256 {corpus_hash[:16]}"
    )
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_vocab_size(cfg.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids[BOS])
    w.add_eos_token_id(ids[EOS])
    w.add_eot_token_id(ids[END])
    w.add_pad_token_id(ids[EOS])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for name, arr in tensors_for_gguf(model).items():
        w.add_tensor(name, arr.astype(np.float32 if arr.ndim == 1 else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load_from_gguf(path: Path):
    """Rebuild the torch model from a written GGUF (checks names, shapes and layout of the export)."""
    import gguf
    import torch

    r = gguf.GGUFReader(str(path))

    def field(key: str):
        return r.fields[key].contents()

    cfg = Config(
        field("general.name"),
        n_embd=field("llama.embedding_length"),
        n_layer=field("llama.block_count"),
        n_head=field("llama.attention.head_count"),
        n_ff=field("llama.feed_forward_length"),
        n_vocab=field("llama.vocab_size"),
    )
    model = build_model(cfg)
    arrays = {t.name: np.asarray(t.data, dtype=np.float32) for t in r.tensors}
    mapping = {v: k for k, v in _gguf_names(cfg).items()}
    state = {mapping[name]: torch.from_numpy(arr.copy()) for name, arr in arrays.items()}
    model.load_state_dict(state)
    return model.eval()


#: The export check's tolerances: F16 weights read back into torch vs llama.cpp's own kernels.
MAX_LOGIT_DIFF = 0.1
MIN_ARGMAX_AGREEMENT = 0.99


@dataclass(frozen=True)
class ExportCheck:
    """What :func:`verify` measured for one written GGUF file."""

    name: str
    positions: int
    max_logit_diff: float
    argmax_agreement: float
    tokenizer_matches: bool | None = None  # None: not checked (--verify-only has no training tokenizer)

    def problems(self) -> list[str]:
        """Why this export is wrong; empty when it passes."""
        out = []
        if self.positions < 2:
            out.append(f"{self.name}: only {self.positions} position(s) compared")
        if not self.max_logit_diff <= MAX_LOGIT_DIFF:  # written so that nan fails too
            out.append(
                f"{self.name}: torch and llama.cpp logits differ by up to {self.max_logit_diff:.4f} "
                f"(limit {MAX_LOGIT_DIFF})"
            )
        if not self.argmax_agreement >= MIN_ARGMAX_AGREEMENT:
            out.append(
                f"{self.name}: torch and llama.cpp pick the same next token at only "
                f"{self.argmax_agreement:.1%} of positions (limit {MIN_ARGMAX_AGREEMENT:.0%})"
            )
        if self.tokenizer_matches is False:
            out.append(f"{self.name}: llama.cpp's tokenizer and the training tokenizer give different ids")
        return out


def compare_logits(
    name: str, ref: np.ndarray, out: np.ndarray, tokenizer_matches: bool | None
) -> ExportCheck:
    """Compare llama.cpp's logits ``ref`` with torch's ``out`` (positions x vocabulary)."""
    if ref.shape != out.shape or not ref.size:
        return ExportCheck(name, 0, float("inf"), 0.0, tokenizer_matches)
    diff = float(np.abs(ref - out).max())
    agree = float((ref.argmax(-1) == out.argmax(-1)).mean())
    return ExportCheck(name, ref.shape[0], diff, agree, tokenizer_matches)


def verify(path: Path, prompt: str, log, tok=None) -> ExportCheck:
    """Logits of torch (weights read back from the GGUF) and of llama.cpp at every position of ``prompt``."""
    import llama_cpp

    torch = _torch()
    model = load_from_gguf(path)
    llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=1, logits_all=True, verbose=False)
    try:
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
        matches = None
        if tok is not None:
            matches = ids == [llm.token_bos(), *tok.encode(prompt, add_special_tokens=False).ids]
        llm.eval(ids)
        ref = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()
    with torch.no_grad():
        out = model(torch.tensor([ids]))[0].numpy()
    check = compare_logits(path.name, ref, out, matches)
    log(
        f"verify {path.name}: {check.positions} positions, max |logit diff| {check.max_logit_diff:.4f} "
        f"(logit range {out.min():.1f}..{out.max():.1f}), argmax agreement {check.argmax_agreement:.3f}"
        + ("" if matches is None else f", tokenizer ids {'match' if matches else 'DIFFER'}")
    )
    return check


def verdict(checks: list[ExportCheck]) -> int:
    """The script's exit status: 1 (every problem printed on stderr) when any export check failed, else 0."""
    problems = [p for c in checks for p in c.problems()]
    for p in problems:
        print(f"verification FAILED: {p}", file=sys.stderr, flush=True)
    return 1 if problems else 0


def parser() -> argparse.ArgumentParser:
    """The command line; its defaults are the recipe of the shipped files."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    ap.add_argument("--steps", type=int, default=700, help="joint target+draft training steps")
    ap.add_argument("--distil-steps", type=int, default=100, help="extra draft-only distillation steps")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--no-verify", action="store_true", help="skip the torch vs llama.cpp logits check")
    ap.add_argument("--verify-only", action="store_true", help="only check the GGUF files already in --out")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    if args.verify_only:
        return verdict(
            [verify(args.out / f"tiny-{kind}.gguf", VERIFY_PROMPT, log) for kind in ("target", "draft")]
        )

    files = stdlib_files(args.corpus)
    digest = corpus_sha256(files)
    log(f"corpus: {len(files)} files from {args.corpus}, sha256 {digest}")
    tok = train_tokenizer([t for _, t in files])
    tokens, types, merges = vocab_tables(tok)
    ids = special_ids(tok)
    stream, starts = encode_stream(tok, files)
    chats = [tok.encode(c, add_special_tokens=False).ids for c in chat_examples(files)]
    log(
        f"tokenizer: {len(tokens)} tokens, {len(merges)} merges; stream {len(stream)} tokens, "
        f"{len(starts)} line starts, {len(chats)} chat examples"
    )

    target, draft = train(args.steps, args.distil_steps, args.batch, stream, starts, chats, ids, log)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, model in (("target", target), ("draft", draft)):
        paths[kind] = args.out / f"tiny-{kind}.gguf"
        write_gguf(paths[kind], model, tokens, types, merges, ids, digest)
        log(f"wrote {paths[kind]} ({paths[kind].stat().st_size} bytes)")
    if args.no_verify:
        return 0
    return verdict([verify(path, VERIFY_PROMPT, log, tok) for path in paths.values()])


if __name__ == "__main__":
    sys.exit(main())
