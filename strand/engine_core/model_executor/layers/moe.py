"""Sparse mixture-of-experts MLP (Qwen3-MoE): softmax router, top-k experts per token.

Experts are stored stacked ([num_experts, 2 * inter, hidden] for gate|up, [num_experts, hidden,
inter] for down), as transformers 5 keeps them; the checkpoint's per-expert tensors are copied
into slices. On every device the tokens are sorted by expert once, so each selected expert runs
one matmul over all of its tokens (vLLM's fused_moe shape without the kernel): no loop per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from strand.engine_core.model_executor.layers.activation import act_and_mul
from strand.engine_core.model_executor.layers.linear import Linear


class SparseMoeBlock(nn.Module):
    def __init__(self, hidden_size: int, inter: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool, act: str = "silu") -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.act = act
        self.gate = Linear(hidden_size, num_experts, bias=False)  # the router
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden_size))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, inter))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [num_tokens, top_k] in x's dtype, expert ids [num_tokens, top_k])."""
        logits = self.gate(x)  # [num_tokens, num_experts]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden]
        weights, experts = self.route(x)
        flat = experts.flatten()  # [num_tokens * top_k]: entry j belongs to token j // top_k
        order = torch.argsort(flat, stable=True)
        token_of = order // self.top_k  # [num_tokens * top_k] tokens grouped by expert
        weight_of = weights.flatten()[order].unsqueeze(1)  # [num_tokens * top_k, 1]
        # One host read of the counts per layer: the slices below need them on the host.
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        xs = x.index_select(0, token_of)  # [num_tokens * top_k, hidden]
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = slice(start, start + count)
            h = act_and_mul(F.linear(xs[rows], self.w13[expert]), self.act)
            y = F.linear(h, self.w2[expert]) * weight_of[rows]
            out.index_add_(0, token_of[rows], y)
            start += count
        return out
