"""GGUF tensors under their HF names, dequantized to float32 a few rows at a time."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from strand.engine_core.model_executor.gguf.tensor_table import release

# llama.cpp's tensor names -> HF's (blk.N. -> model.layers.N.).
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
          "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
          "ffn_norm": "post_attention_layernorm"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

# Rows dequantized at a time: gguf's dequantization makes several temporaries the size of its
# input (a 49152 x 2048 Q6_K table took 3.3 GB at its peak whole). A piece of 1M weights keeps
# them in the caches: the wide 0.63B Q4_K_M file dequantized in 1.66 s so against 2.72 s in
# pieces of 4M (three runs each, the same figure every run).
PIECE_WEIGHTS = 1 << 20


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


def hf_shape(t: Any) -> tuple[int, ...]:
    """A GGUF tensor's shape as HF writes it (GGUF lists the row length first)."""
    return tuple(int(n) for n in reversed(t.shape))


def dequantized_rows(t: Any, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of a GGUF tensor (all of a 1-D one) in float32, dequantized a piece of
    rows at a time into the result (as the file has them: q/k still permuted)."""
    from gguf.quants import dequantize

    data = t.data
    if data.ndim < 2:
        return np.asarray(dequantize(data, t.tensor_type), dtype=np.float32)
    out = np.empty((stop - start, int(t.shape[0])), dtype=np.float32)
    step = max(1, PIECE_WEIGHTS // int(t.shape[0]))  # rows of t.shape[0] weights each
    kernel = _kernel_dequantize(int(t.tensor_type))
    for first in range(start, stop, step):
        last = min(stop, first + step)
        if kernel is not None:
            kernel(data[first:last], out[first - start:last - start])
        else:
            out[first - start:last - start] = dequantize(data[first:last], t.tensor_type)
        release(data[first:last])  # read: the file's pages need not stay in this process
    return out


def _kernel_dequantize(qtype: int) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """The C++ kernels' dequantization of GGUF rows into float32 rows, where they read the
    type as the file has it and are built already: the same floats as gguf's, bit for bit
    (tests/kernels/test_cpu_gguf_linear.py), several times as fast on the wide 0.63B model's
    Q4_K, Q5_0 and Q8_0 tensors."""
    from strand.kernels.gguf_linear_ref import Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q8_0

    if qtype not in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K):
        return None
    from strand.kernels._cpu_build import KERNELS

    module = KERNELS.built()
    if module is None:
        return None

    def run(rows: np.ndarray, out: np.ndarray) -> None:
        # A copy of the rows' blocks: the file's memory map is read-only, which torch refuses.
        module.gguf_dequantize(torch.from_numpy(out), torch.from_numpy(np.array(rows)), qtype)

    return run
