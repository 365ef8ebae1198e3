"""fp32 logits of the runner (paged cache, torch backend) equal HF transformers' on the same dir."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine_core.model_executor.conftest import (
    VARIANTS,
    Blocks,
    LogitsSpy,
    hf_logits,
    make_runner,
    max_rel_err,
    new_req,
    prompt,
    step,
)

TOL = 1e-4


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_at_every_prompt_position_match_hf(variant: str,
                                                         variant_dirs: dict[str, Path]) -> None:
    model_dir = variant_dirs[variant]
    runner = make_runner(model_dir)
    tokens = prompt(1, 23)
    blocks = Blocks(runner.block_size)
    so = step(new=[new_req("a", tokens, blocks.take(0, 23))], num_scheduled={"a": 23})
    runner.update_states(so)
    inputs = runner.prepare_inputs(so)
    with torch.inference_mode():
        hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches,
                              inputs.metadata, runner.attn_backend)
        ours = runner.model.compute_logits(hidden)
    assert max_rel_err(ours, hf_logits(model_dir, tokens)) < TOL


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decode_logits_match_hf_and_greedy_tokens_are_the_argmax(
        variant: str, variant_dirs: dict[str, Path]) -> None:
    model_dir = variant_dirs[variant]
    runner = make_runner(model_dir)
    spy = LogitsSpy(runner)
    tokens = prompt(2, 13)
    blocks = Blocks(runner.block_size)
    out = runner.execute_model(step(new=[new_req("a", tokens, blocks.take(0, 13))],
                                    num_scheduled={"a": 13}))
    for _ in range(4):
        ref = hf_logits(model_dir, tokens)[-1]
        assert max_rel_err(spy.last[0], ref) < TOL
        assert out.sampled_token_ids == [[int(ref.argmax())]]
        tokens = tokens + out.sampled_token_ids[0]
        n = len(tokens)
        out = runner.execute_model(step(cached=[("a", blocks.take(n - 1, n), n - 1)],
                                        num_scheduled={"a": 1}))


def test_greedy_decode_of_tiny_model_is_not_degenerate(llama_dir: Path) -> None:
    # The random init must give varied greedy tokens, or parity tests prove little.
    runner = make_runner(llama_dir)
    tokens = prompt(3, 8)
    blocks = Blocks(runner.block_size)
    out = runner.execute_model(step(new=[new_req("a", tokens, blocks.take(0, 8))],
                                    num_scheduled={"a": 8}))
    generated = []
    for _ in range(12):
        generated += out.sampled_token_ids[0]
        n = len(tokens) + len(generated)
        out = runner.execute_model(step(cached=[("a", blocks.take(n - 1, n), n - 1)],
                                        num_scheduled={"a": 1}))
    assert len(set(generated)) >= 4


def test_bfloat16_runner_stays_close_to_fp32_hf(llama_dir: Path) -> None:
    runner = make_runner(llama_dir, dtype="bfloat16")
    spy = LogitsSpy(runner)
    tokens = prompt(4, 17)
    runner.execute_model(step(new=[new_req("a", tokens, Blocks(4).take(0, 17))],
                              num_scheduled={"a": 17}))
    assert spy.last.dtype == torch.bfloat16
    assert max_rel_err(spy.last[0], hf_logits(llama_dir, tokens)[-1]) < 5e-2
