"""A GGUF file read as a checkpoint: its tensors under their HF names, through the part of
safetensors' `safe_open` interface the loader uses (keys, get_slice(name)[rows or columns],
get_tensor), dequantized to float32 when they are read.

Why not a float copy on disk: a 7B Q4_K_M file (4 GB) made 28 GB of float32 safetensors beside
itself, and with quantization='gguf' most of it was never read. Reading the file's blocks at
load costs about as much as reading that copy (gguf's dequantization: some 200M weights a second
on one core), and the layers kept packed are never dequantized at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from strand.engine_core.model_executor.gguf.tensor_table import read_tensors
from strand.engine_core.model_executor.gguf.tensors import (
    dequantized_rows,
    hf_name,
    hf_shape,
    unpermute,
)

# Architectures whose GGUF q/k rows llama.cpp's converter permuted (see tensors.unpermute).
PERMUTED_TYPES = ("llama", "mistral")


class GGUFSlice:
    """One tensor: its shape without reading it, and rows (part[a:b]), columns (part[:, a:b])
    or all of it (part[:]) dequantized when indexed."""

    def __init__(self, tensor: Any, heads: int | None) -> None:
        self._tensor = tensor
        self._heads = heads  # q/k of a permuted architecture: rows un-permuted within heads

    def get_shape(self) -> list[int]:
        return list(hf_shape(self._tensor))

    def _rows(self, start: int, stop: int) -> np.ndarray:
        t = self._tensor
        if self._heads is None:
            return dequantized_rows(t, start, stop)
        # A row's place depends on its whole head's rows (never another head's): the heads the
        # range touches, un-permuted, then the range.
        head = int(t.shape[1]) // self._heads
        first, last = start // head * head, -(-stop // head) * head
        block = unpermute(dequantized_rows(t, first, last), (last - first) // head)
        return block[start - first:stop - first]

    def __getitem__(self, key: slice | tuple[slice, ...]) -> torch.Tensor:
        rows, cols = (key, slice(None)) if isinstance(key, slice) else (key + (slice(None),))[:2]
        shape = self.get_shape()
        start, stop, step = rows.indices(shape[0])
        if step != 1 or (len(shape) < 2 and cols != slice(None)):
            raise IndexError(f"a GGUF tensor reads contiguous rows or columns, not {key!r}")
        if len(shape) < 2:
            return torch.from_numpy(self._rows(0, shape[0])[start:stop].copy())
        return torch.from_numpy(np.ascontiguousarray(self._rows(start, stop)[:, cols]))


class GGUFWeights:
    """A GGUF file's tensors under their HF names; `config` the converted directory's
    config.json (model_type, heads, tie_word_embeddings)."""

    def __init__(self, path: str | Path, config: dict[str, Any]) -> None:
        self.path = Path(path)
        permute = config.get("model_type") in PERMUTED_TYPES
        heads = {"q_proj": config.get("num_attention_heads"),
                 "k_proj": config.get("num_key_value_heads")}
        tied = bool(config.get("tie_word_embeddings"))
        self._slices: dict[str, GGUFSlice] = {}
        for t in read_tensors(self.path):
            name = hf_name(t.name)
            if name is None or (tied and name == "lm_head.weight"):  # a tied head: the table's
                continue
            proj = name.split(".")[-2]
            self._slices[name] = GGUFSlice(t, heads[proj] if permute and proj in heads else None)

    def keys(self) -> list[str]:
        return list(self._slices)

    def get_slice(self, name: str) -> GGUFSlice:
        return self._slices[name]

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._slices[name][:]

    def __enter__(self) -> GGUFWeights:
        return self

    def __exit__(self, *exc: object) -> None:  # the reader's memory map closes with it
        return None
