"""What a model costs in memory before it loads, from its header: the KV cache one sequence needs."""

from __future__ import annotations

from localspec.gguf.meta import GGUFMetadata


def kv_bytes_per_sequence(meta: GGUFMetadata, n_ctx: int) -> int:
    """The f16 KV cache one sequence of ``n_ctx`` tokens takes (llama.cpp's default cache type), every layer
    counted as attention (a hybrid's recurrent layers take less: an upper bound then).

    Args:
        meta: the model's header (:func:`localspec.gguf.meta.read_metadata`).
        n_ctx: the sequence's room in tokens.

    Returns:
        Bytes; 0 when the header lacks the sizes (nothing to go by).
    """
    arch = meta.architecture or ""

    def number(key: str, default: int = 0) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if isinstance(value, list):  # per-layer counts (some hybrids): the largest bounds them
            value = max((v for v in value if isinstance(v, int)), default=default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    n_layer, n_embd, n_head = (
        number("block_count"),
        number("embedding_length"),
        number("attention.head_count"),
    )
    if not (n_layer and n_embd and n_head):
        return 0
    n_head_kv = number("attention.head_count_kv", n_head)
    k_len = number("attention.key_length", n_embd // n_head)
    v_len = number("attention.value_length", n_embd // n_head)
    return n_ctx * n_layer * n_head_kv * (k_len + v_len) * 2
