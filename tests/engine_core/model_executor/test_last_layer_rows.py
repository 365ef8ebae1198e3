"""The forward's `rows`: the output at those rows equals the full output's, the last layer's MLP
runs for those rows alone, and every layer's K/V are still written for every token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core.model_executor.model_runner import ModelRunner, StepInputs
from tests.engine_core.model_executor.conftest import (
    Blocks,
    build_model_dir,
    make_runner,
    new_req,
    prompt,
    step,
)

ARCHS: dict[str, dict[str, Any]] = {"llama": {"arch": "llama"},  # LlamaForCausalLM: its own forward
         "qwen3_moe": {"arch": "qwen3_moe", "num_layers": 3},  # a subclass, sparse MLPs
         "gemma2": {"arch": "gemma2", "sliding_window": 8}}  # GemmaForCausalLM: four norms


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: build_model_dir(tmp_path_factory.mktemp(name), **spec)
            for name, spec in ARCHS.items()}


def last_mlp(runner: ModelRunner) -> torch.nn.Module:
    layer: Any = runner.model.model.layers[-1]
    mlp: torch.nn.Module = layer.mlp
    return mlp


def two_prompts_step(runner: ModelRunner) -> StepInputs:
    blocks = Blocks(runner.block_size)
    so = step(new=[new_req("a", prompt(1, 9), blocks.take(0, 9)),
                   new_req("b", prompt(2, 14), blocks.take(0, 14))],
              num_scheduled={"a": 9, "b": 14})
    runner.update_states(so)
    return runner.prepare_inputs(so)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_selected_rows_equal_the_full_forwards_and_the_cache_is_the_same(
        arch: str, arch_dirs: dict[str, Path]) -> None:
    full_runner, rows_runner = make_runner(arch_dirs[arch]), make_runner(arch_dirs[arch])
    full_in, rows_in = two_prompts_step(full_runner), two_prompts_step(rows_runner)
    rows = torch.tensor([8, 22])  # each prompt's last token: the rows sampled
    mlp_rows: list[int] = []
    last_mlp(rows_runner).register_forward_hook(
        lambda m, args, out: mlp_rows.append(args[0].shape[0]))
    with torch.inference_mode():
        full = full_runner.model(full_in.input_ids, full_in.positions, full_runner.kv_caches,
                                 full_in.metadata, full_runner.attn_backend)
        ours = rows_runner.model(rows_in.input_ids, rows_in.positions, rows_runner.kv_caches,
                                 rows_in.metadata, rows_runner.attn_backend, rows=rows)
    assert full.shape[0] == 23 and ours.shape[0] == 2
    torch.testing.assert_close(ours, full[rows], rtol=1e-5, atol=1e-5)
    assert mlp_rows == [2]
    for full_cache, cache in zip(full_runner.kv_caches, rows_runner.kv_caches, strict=True):
        torch.testing.assert_close(cache, full_cache, rtol=0, atol=0)


def test_every_row_asked_for_runs_every_row(arch_dirs: dict[str, Path]) -> None:
    runner = make_runner(arch_dirs["llama"])
    inputs = two_prompts_step(runner)
    mlp_rows: list[int] = []
    last_mlp(runner).register_forward_hook(
        lambda m, args, out: mlp_rows.append(args[0].shape[0]))
    with torch.inference_mode():
        out = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches,
                           inputs.metadata, runner.attn_backend, rows=torch.arange(23))
    assert out.shape[0] == 23 and mlp_rows == [23]


def test_under_lora_the_last_layer_runs_every_row(arch_dirs: dict[str, Path]) -> None:
    # Adapters map to the step's tokens one by one; the rows are picked after the final norm.
    runner = make_runner(arch_dirs["llama"])
    inputs = two_prompts_step(runner)
    mlp_rows: list[int] = []
    last_mlp(runner).register_forward_hook(
        lambda m, args, out: mlp_rows.append(args[0].shape[0]))
    runner.model.lora_active = True
    with torch.inference_mode():
        out = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches,
                           inputs.metadata, runner.attn_backend, rows=torch.tensor([8, 22]))
    assert out.shape[0] == 2 and mlp_rows == [23]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_no_rows_asked_for_still_fills_the_cache(arch: str, dtype: str,
                                                 arch_dirs: dict[str, Path]) -> None:
    # A step of partial prefill chunks samples nothing: the last layer stops after its K/V.
    full_runner = make_runner(arch_dirs[arch], dtype=dtype)
    rows_runner = make_runner(arch_dirs[arch], dtype=dtype)
    full_in, rows_in = two_prompts_step(full_runner), two_prompts_step(rows_runner)
    with torch.inference_mode():
        full_runner.model(full_in.input_ids, full_in.positions, full_runner.kv_caches,
                          full_in.metadata, full_runner.attn_backend)
        out = rows_runner.model(rows_in.input_ids, rows_in.positions, rows_runner.kv_caches,
                                rows_in.metadata, rows_runner.attn_backend,
                                rows=torch.empty(0, dtype=torch.int64))
    assert out.shape == (0, full_runner.model.config.hidden_size)
    for full_cache, cache in zip(full_runner.kv_caches, rows_runner.kv_caches, strict=True):
        torch.testing.assert_close(cache, full_cache, rtol=0, atol=0)
