"""Which heads, MLP columns and vocabulary rows each rank holds (no processes needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from strand.engine_core.distributed.layers import shard_layout
from strand.engine_core.distributed.shard_loading import fused_ranges, shard_range
from strand.engine_core.model_executor.model_config import load_model_config
from tests.conftest import build_tiny_model


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 8 query heads, 2 KV heads, head_dim 8, intermediate 256 (the builder's default 4 x hidden).
    return build_tiny_model(tmp_path_factory.mktemp("shard"), with_tokenizer=False,
                            num_heads=8, num_kv_heads=2, vocab_size=509)


def test_kv_heads_split_when_there_are_at_least_as_many_as_ranks(config_dir: Path) -> None:
    config = load_model_config(str(config_dir), "float32")
    layouts = [shard_layout(config, r, 2) for r in range(2)]
    assert [(lay.num_heads, lay.num_kv_heads, lay.first_kv_head) for lay in layouts] == [
        (4, 1, 0), (4, 1, 1)]


def test_kv_heads_replicated_so_each_rank_holds_its_query_heads_group(config_dir: Path) -> None:
    config = load_model_config(str(config_dir), "float32")
    # 4 ranks, 2 KV heads: ranks 0-1 hold KV head 0 (query heads 0-3), ranks 2-3 KV head 1.
    layouts = [shard_layout(config, r, 4) for r in range(4)]
    assert [lay.first_kv_head for lay in layouts] == [0, 0, 1, 1]
    assert all(lay.num_kv_heads == 1 and lay.num_heads == 2 for lay in layouts)
    head_dim = config.head_dim
    assert shard_range("model.layers.0.self_attn.k_proj.weight", layouts[2]) == (
        0, head_dim, head_dim)
    assert shard_range("model.layers.0.self_attn.q_proj.weight", layouts[2]) == (
        0, 2 * 2 * head_dim, 2 * head_dim)


def test_vocab_rows_padded_on_the_last_rank(config_dir: Path) -> None:
    config = load_model_config(str(config_dir), "float32")
    first, last = shard_layout(config, 0, 2), shard_layout(config, 1, 2)
    assert (first.vocab_start, first.vocab_rows) == (0, 255)
    assert (last.vocab_start, last.vocab_rows, last.vocab_per_rank) == (255, 254, 255)
    assert shard_range("lm_head.weight", last) == (0, 255, 254)


def test_row_parallel_layers_split_their_input_features(config_dir: Path) -> None:
    config = load_model_config(str(config_dir), "float32")
    lay = shard_layout(config, 1, 2)
    assert shard_range("model.layers.1.mlp.down_proj.weight", lay) == (
        1, config.intermediate_size // 2, config.intermediate_size // 2)
    assert shard_range("model.layers.1.self_attn.o_proj.weight", lay) == (
        1, 4 * config.head_dim, 4 * config.head_dim)
    assert shard_range("model.layers.1.input_layernorm.weight", lay) is None


@pytest.mark.parametrize(("heads", "kv_heads", "size", "field"), [
    (8, 2, 3, "num_attention_heads"), (6, 3, 2, "num_key_value_heads"),
    (8, 3, 4, "num_key_value_heads"), (8, 2, 8, "intermediate_size")])
def test_a_split_that_does_not_divide_names_the_field(config_dir: Path, heads: int,
                                                      kv_heads: int, size: int,
                                                      field: str) -> None:
    config = dataclasses.replace(load_model_config(str(config_dir), "float32"),
                                 num_heads=heads, num_kv_heads=kv_heads,
                                 intermediate_size=256 if size != 8 else 252)
    with pytest.raises(ValueError, match=field):
        shard_layout(config, 0, size)


def test_phi3_fused_qkv_rows_are_each_ranks_q_k_and_v_heads(tmp_path: Path) -> None:
    # 8 query heads, 2 KV heads, head_dim 8: the fused tensor is [64 q | 16 k | 16 v] rows.
    config = load_model_config(str(build_tiny_model(
        tmp_path, arch="phi3", num_heads=8, num_kv_heads=2, with_tokenizer=False)), "float32")
    lay = shard_layout(config, 1, 2)
    assert fused_ranges("model.layers.0.self_attn.qkv_proj.weight", lay) == [
        (32, 32), (64 + 8, 8), (64 + 16 + 8, 8)]
    # gate_up is [inter gate | inter up] rows; rank 1 holds the second half of each.
    inter = config.intermediate_size
    assert fused_ranges("model.layers.3.mlp.gate_up_proj.weight", lay) == [
        (inter // 2, inter // 2), (inter + inter // 2, inter // 2)]
    assert fused_ranges("model.layers.0.self_attn.o_proj.weight", lay) is None


def test_each_expert_is_split_on_its_width_and_the_router_is_whole(tmp_path: Path) -> None:
    config = load_model_config(str(build_tiny_model(
        tmp_path, arch="qwen3_moe", with_tokenizer=False,
        extra_config={"moe_intermediate_size": 48})), "float32")
    lay = shard_layout(config, 1, 2)
    assert lay.moe_intermediate_size == 24
    p = "model.layers.0.mlp."
    assert shard_range(p + "experts.5.gate_proj.weight", lay) == (0, 24, 24)
    assert shard_range(p + "experts.5.up_proj.weight", lay) == (0, 24, 24)
    assert shard_range(p + "experts.5.down_proj.weight", lay) == (1, 24, 24)
    assert shard_range(p + "gate.weight", lay) is None


def test_only_the_mlp_widths_some_layer_uses_must_divide(tmp_path: Path) -> None:
    # Every layer sparse: the unused dense intermediate_size (127) does not block the split.
    config = load_model_config(str(build_tiny_model(
        tmp_path, arch="qwen3_moe", with_tokenizer=False, intermediate_size=127)), "float32")
    assert shard_layout(config, 0, 2).moe_intermediate_size == 32
    dense_layer = dataclasses.replace(config, arch=dataclasses.replace(
        config.arch, moe_layers=(False, True)))
    with pytest.raises(ValueError, match=r"must divide intermediate_size \(127\)"):
        shard_layout(dense_layer, 0, 2)
