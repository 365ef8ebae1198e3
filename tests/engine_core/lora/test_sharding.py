"""A LoRA adapter's per-rank slices (no processes): for column-parallel modules the ranks' deltas
are the full delta's output columns, for row-parallel ones they sum to the full delta, with
KV heads split or replicated; adapters are checked against the full model's shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from strand.engine_core.distributed.layers import shard_layout
from strand.engine_core.lora.peft_adapter import LoRAAdapter
from strand.engine_core.lora.sharding import full_shapes, shard_adapter
from strand.engine_core.model_executor.model_config import ModelConfig, load_model_config
from tests.conftest import build_tiny_model

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
RANK = 4


def _config(tmp_path: Path, num_kv_heads: int) -> ModelConfig:
    # hidden 64, 8 query heads of 8, intermediate 256 (the builder's default 4 x hidden).
    model_dir = build_tiny_model(tmp_path / f"kv{num_kv_heads}", with_tokenizer=False,
                                 num_heads=8, num_kv_heads=num_kv_heads)
    return load_model_config(str(model_dir), "float32")


def _adapter(config: ModelConfig) -> LoRAAdapter:
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
              "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
              "down_proj": (inter, hidden)}
    gen = torch.Generator().manual_seed(0)
    weights = {(0, m): (torch.randn(RANK, i, generator=gen), torch.randn(o, RANK, generator=gen))
               for m, (i, o) in shapes.items()}
    return LoRAAdapter(1, "a", RANK, weights)


@pytest.mark.parametrize(("num_kv_heads", "world_size"), [(2, 2), (1, 2), (2, 4)],
                         ids=["kv-split", "kv-replicated", "kv-split-and-replicated"])
def test_rank_deltas_rebuild_the_full_delta(tmp_path: Path, num_kv_heads: int,
                                            world_size: int) -> None:
    config = _config(tmp_path, num_kv_heads)
    full = _adapter(config)
    layouts = [shard_layout(config, r, world_size) for r in range(world_size)]
    shards = [shard_adapter(full, layout) for layout in layouts]
    for module in COLUMN + ROW:
        a, b = full.weights[(0, module)]
        x = torch.randn(3, a.shape[1], dtype=torch.float64)
        delta = x @ a.double().t() @ b.double().t()  # [3, out]
        if module in ROW:
            # Each rank sees its slice of x (its inputs); the all-reduce sums the partials.
            total = torch.zeros_like(delta)
            for layout, shard in zip(layouts, shards, strict=True):
                sa, sb = shard.weights[(0, module)]
                width = sa.shape[1]
                xs = x[:, layout.rank * width:(layout.rank + 1) * width]
                total += xs @ sa.double().t() @ sb.double().t()
                assert torch.equal(sb, b)  # B whole
            torch.testing.assert_close(total, delta)
            continue
        per_head = config.head_dim
        for layout, shard in zip(layouts, shards, strict=True):
            sa, sb = shard.weights[(0, module)]
            assert torch.equal(sa, a)  # A whole
            if module in ("k_proj", "v_proj"):
                start, size = layout.first_kv_head * per_head, layout.num_kv_heads * per_head
            elif module == "q_proj":
                size = layout.num_heads * per_head
                start = layout.rank * size
            else:
                size = layout.intermediate_size
                start = layout.rank * size
            torch.testing.assert_close(x @ sa.double().t() @ sb.double().t(),
                                       delta[:, start:start + size])


def test_full_shapes_undo_the_split_even_for_replicated_kv_heads(tmp_path: Path) -> None:
    config = _config(tmp_path, 1)  # one KV head, replicated on both ranks
    layout = shard_layout(config, 1, 2)
    head, hidden = config.head_dim, config.hidden_size
    local = {"q_proj": (hidden, layout.num_heads * head), "k_proj": (hidden, head),
             "v_proj": (hidden, head), "o_proj": (layout.num_heads * head, hidden),
             "gate_proj": (hidden, layout.intermediate_size),
             "up_proj": (hidden, layout.intermediate_size),
             "down_proj": (layout.intermediate_size, hidden)}
    assert full_shapes(local, config) == {
        "q_proj": (hidden, 8 * head), "k_proj": (hidden, head), "v_proj": (hidden, head),
        "o_proj": (8 * head, hidden), "gate_proj": (hidden, config.intermediate_size),
        "up_proj": (hidden, config.intermediate_size),
        "down_proj": (config.intermediate_size, hidden)}
