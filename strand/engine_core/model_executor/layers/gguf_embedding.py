"""The token embedding table kept in a GGUF file's blocks (`--quantization gguf`), as llama.cpp
keeps it: a lookup dequantizes only the rows it reads (each row's 16-row tile, where the blocks
are tiled). A tied table is its lm_head's blocks; an untied one is the file's token_embd,
packed as a layer's weight is (gguf/quantized.py). The float table, vocabulary x hidden in the
model's dtype (2 GiB for a Llama-3 8B in float32, more than a third of its Q4_K_M file), is
never made. The rows are the dequantized table's, bit for bit: the same dequantization."""

from __future__ import annotations

import torch
from torch import nn

from strand.engine_core.model_executor.layers.gguf_linear import GGUFLinear
from strand.kernels.cpu_gguf_linear import gguf_dequantize
from strand.kernels.gguf_linear_ref import TILE_ROWS


class GGUFEmbedding(nn.Module):
    def __init__(self, table: GGUFLinear, dtype: torch.dtype) -> None:
        super().__init__()
        if table.more_types or table.bias is not None:
            raise ValueError("a GGUF embedding table is one weight of one type, without bias")
        self.table = table  # the lm_head itself where the two are tied
        self.dtype = dtype
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [...] -> [..., hidden]
        ids = input_ids.reshape(-1)
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < self.num_embeddings:
            raise IndexError(f"token ids must be in [0, {self.num_embeddings}), got "
                             f"{int(ids.min())}..{int(ids.max())}")
        packed, qtype, hidden = self.table.packed, self.table.qtype, self.embedding_dim
        if packed.dim() == 3:  # 16-row tiles: each distinct tile once, then the rows of it
            tiles, where = torch.unique(ids // TILE_ROWS, return_inverse=True)
            rows = gguf_dequantize(packed[tiles].contiguous(), qtype, hidden)
            found = rows.view(-1, TILE_ROWS, hidden)[where, ids % TILE_ROWS]
        else:
            found = gguf_dequantize(packed[ids].contiguous(), qtype, hidden)
        return found.to(self.dtype).view(*input_ids.shape, hidden)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, from GGUF blocks"
