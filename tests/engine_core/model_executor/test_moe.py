"""SparseMoeBlock (tokens grouped by expert, one matmul per chosen expert) against a per-token
loop written for obviousness."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from strand.engine_core.model_executor.layers.moe import SparseMoeBlock


def make_block(norm_topk_prob: bool, seed: int = 0) -> SparseMoeBlock:
    g = torch.Generator().manual_seed(seed)
    block = SparseMoeBlock(hidden_size=16, inter=24, num_experts=6, top_k=2,
                           norm_topk_prob=norm_topk_prob)
    with torch.no_grad():
        block.gate.weight.copy_(torch.randn(6, 16, generator=g))
        block.w13.copy_(torch.randn(6, 48, 16, generator=g) / 4)
        block.w2.copy_(torch.randn(6, 16, 24, generator=g) / 5)
    return block


def per_token_reference(block: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        probs = torch.softmax(block.gate.weight @ x[t], dim=-1)
        weights, experts = probs.topk(block.top_k)
        if block.norm_topk_prob:
            weights = weights / weights.sum()
        for w, e in zip(weights.tolist(), experts.tolist(), strict=True):
            gate, up = (block.w13[e] @ x[t]).chunk(2)
            out[t] += w * (block.w2[e] @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_grouped_experts_equal_the_per_token_loop(norm_topk_prob: bool) -> None:
    block = make_block(norm_topk_prob)
    x = torch.randn(37, 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(block(x), per_token_reference(block, x), atol=1e-5, rtol=1e-5)


def test_tokens_spread_over_experts_and_unused_experts_are_skipped() -> None:
    block = make_block(True)
    x = torch.randn(37, 16, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        _, experts = block.route(x)
        assert len(set(experts.flatten().tolist())) >= 4
        # An expert no token chose may hold anything: NaN weights there change nothing.
        unused = sorted(set(range(6)) - set(experts.flatten().tolist()))
        before = block(x)
        for e in unused:
            block.w13[e] = float("nan")
        torch.testing.assert_close(block(x), before)


def test_one_token_routes_to_top_k_experts() -> None:
    block = make_block(True)
    x = torch.randn(1, 16, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        weights, experts = block.route(x)
        assert experts.shape == (1, 2) and float(weights.sum()) == pytest.approx(1.0)
        torch.testing.assert_close(block(x), per_token_reference(block, x), atol=1e-5, rtol=1e-5)
