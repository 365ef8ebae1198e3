"""GGUF tensors under their HF names, dequantized to float32."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np

# llama.cpp's tensor names -> HF's (blk.N. -> model.layers.N.).
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
          "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
          "ffn_norm": "post_attention_layernorm"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(name: str) -> str | None:
    """The HF name of a GGUF tensor; None for the ones the engine recomputes (rope_freqs)."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = _BLOCK.fullmatch(name)
    if m is None or m.group(2) not in _LAYER:
        return None
    return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"


def unpermute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's converter's reordering of Llama's q/k rows (its rope pairs adjacent
    dimensions, HF's pairs the two halves of each head)."""
    # llama.cpp wrote reshape(heads, 2, rows/heads/2, ...).swapaxes(1, 2): this is its inverse.
    rows = w.shape[0]
    return (w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def hf_shapes(reader: Any) -> list[tuple[str, tuple[int, ...]]]:
    """The HF names and shapes of hf_tensors' tensors, in its order, without reading any data
    (GGUF shapes list the row length first)."""
    return [(name, tuple(int(n) for n in reversed(t.shape))) for t in reader.tensors
            if (name := hf_name(t.name)) is not None]


# Rows dequantized at a time: gguf's dequantization makes several temporaries the size of its
# input (a 49152 x 2048 Q6_K table took 3.3 GB at its peak whole); a piece is a few MB.
PIECE_WEIGHTS = 1 << 22


def hf_tensors(reader: Any, config: dict[str, Any]
               ) -> Iterator[tuple[str, Iterator[np.ndarray]]]:
    """Each tensor's HF name and its float32 rows, a piece at a time (q/k whole: their rows are
    un-permuted across heads)."""
    from gguf.quants import dequantize

    permute = config["model_type"] in ("llama", "mistral")
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}

    def pieces(t: Any, head_count: int | None) -> Iterator[np.ndarray]:
        data = t.data
        if head_count is not None or data.ndim < 2:
            w = np.asarray(dequantize(data, t.tensor_type), dtype=np.float32)
            yield w if head_count is None else unpermute(w, head_count)
            return
        step = max(1, PIECE_WEIGHTS // int(t.shape[0]))  # rows of t.shape[0] weights each
        for start in range(0, data.shape[0], step):
            yield np.asarray(dequantize(data[start:start + step], t.tensor_type), dtype=np.float32)

    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        proj = name.split(".")[-2]
        yield name, pieces(t, heads[proj] if permute and proj in heads else None)
