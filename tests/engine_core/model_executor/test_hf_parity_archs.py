"""Qwen3, Qwen3-MoE, Phi-3, Mistral with a window, Gemma 2 and Gemma 3: fp32 logits of the runner (paged cache, torch
backend) equal HF transformers' on the same tiny directory, with windows shorter than the
prompts so the sliding layers really slide."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core.model_executor.models.llama import LlamaAttention
from tests.engine_core.model_executor.conftest import (
    Blocks,
    LogitsSpy,
    build_model_dir,
    hf_logits,
    make_runner,
    max_rel_err,
    new_req,
    prompt,
    step,
)

TOL = 1e-4
WINDOW = 8
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
            "long_factor": [2.0 + 0.5 * i for i in range(8)]}
ARCH_VARIANTS: dict[str, dict[str, Any]] = {
    "qwen3": {"arch": "qwen3"},
    "qwen3_moe": {"arch": "qwen3_moe", "num_layers": 3, "extra_config": {"mlp_only_layers": [1]}},
    "phi3_window": {"arch": "phi3", "sliding_window": WINDOW},
    "mistral_window": {"arch": "mistral", "sliding_window": WINDOW},
    # Phi-3-mini-128k's rope: every test position stays below the original 64, where
    # transformers uses the short factors throughout (test_rotary_longrope.py covers the rest).
    "phi3_longrope": {"arch": "phi3", "rope_scaling": LONGROPE,
                      "extra_config": {"original_max_position_embeddings": 64}},
    # Small caps so soft-capping changes the numbers (Gemma 2's own are 50 and 30).
    "gemma2": {"arch": "gemma2", "sliding_window": WINDOW,
               "extra_config": {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                                "query_pre_attn_scalar": 24}},
    "gemma3": {"arch": "gemma3", "num_layers": 3, "sliding_window": WINDOW,
               "rope_scaling": {"rope_type": "linear", "factor": 4.0},
               "extra_config": {"rope_local_base_freq": 500.0}},
}


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: build_model_dir(tmp_path_factory.mktemp(name), **spec)
            for name, spec in ARCH_VARIANTS.items()}


@pytest.mark.parametrize("variant", list(ARCH_VARIANTS))
def test_prefill_logits_at_every_position_match_hf(variant: str,
                                                   arch_dirs: dict[str, Path]) -> None:
    model_dir = arch_dirs[variant]
    runner = make_runner(model_dir)
    tokens = prompt(1, 23)
    so = step(new=[new_req("a", tokens, Blocks(runner.block_size).take(0, 23))],
              num_scheduled={"a": 23})
    runner.update_states(so)
    inputs = runner.prepare_inputs(so)
    with torch.inference_mode():
        hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches,
                              inputs.metadata, runner.attn_backend)
        ours = runner.model.compute_logits(hidden)
    assert max_rel_err(ours, hf_logits(model_dir, tokens)) < TOL


@pytest.mark.parametrize("variant", list(ARCH_VARIANTS))
def test_batched_chunks_and_decodes_past_the_window_match_hf(
        variant: str, arch_dirs: dict[str, Path]) -> None:
    # One step holds a decode of a 14-token context, a 6-token chunk on 11 cached tokens and a
    # fresh 9-token prompt; then four decode steps of all three, every context past WINDOW.
    model_dir = arch_dirs[variant]
    runner = make_runner(model_dir)
    spy = LogitsSpy(runner)
    blocks = Blocks(runner.block_size)
    seqs = {"a": prompt(2, 14), "b": prompt(3, 17), "c": prompt(4, 9)}
    runner.execute_model(step(new=[new_req("a", seqs["a"], blocks.take(0, 13)),
                                   new_req("b", seqs["b"], blocks.take(0, 11))],
                              num_scheduled={"a": 13, "b": 11}))
    out = runner.execute_model(step(
        new=[new_req("c", seqs["c"], blocks.take(0, 9))],
        cached=[("a", blocks.take(13, 14), 13), ("b", blocks.take(11, 17), 11)],
        num_scheduled={"a": 1, "b": 6, "c": 9}))
    for _ in range(4):
        refs = [hf_logits(model_dir, seqs[r])[-1] for r in ("a", "b", "c")]
        for row, ref in enumerate(refs):
            assert max_rel_err(spy.last[row], ref) < TOL
        assert out.sampled_token_ids == [[int(ref.argmax())] for ref in refs]
        for r, tok in zip(("a", "b", "c"), out.sampled_token_ids, strict=True):
            seqs[r] = seqs[r] + tok
        cached = [(r, blocks.take(len(seqs[r]) - 1, len(seqs[r])), len(seqs[r]) - 1)
                  for r in ("a", "b", "c")]
        out = runner.execute_model(step(cached=cached, num_scheduled=dict.fromkeys(seqs, 1)))


def test_window_and_softcap_change_the_output(arch_dirs: dict[str, Path]) -> None:
    # Guards the parity tests: with the window or the softcap ignored, gemma2's logits move
    # far past TOL, so matching HF proves both are applied.
    model_dir = arch_dirs["gemma2"]
    tokens = prompt(5, 23)
    ref = hf_logits(model_dir, tokens)

    def logits_with(**overrides: Any) -> torch.Tensor:
        runner = make_runner(model_dir)
        for module in runner.model.modules():
            if isinstance(module, LlamaAttention):
                merged = {**module.attn_kwargs, **overrides}
                module.attn_kwargs = {k: v for k, v in merged.items() if v is not None}
        so = step(new=[new_req("a", tokens, Blocks(runner.block_size).take(0, 23))],
                  num_scheduled={"a": 23})
        runner.update_states(so)
        inputs = runner.prepare_inputs(so)
        with torch.inference_mode():
            hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches,
                                  inputs.metadata, runner.attn_backend)
            return runner.model.compute_logits(hidden)

    assert max_rel_err(logits_with(), ref) < TOL
    assert max_rel_err(logits_with(sliding_window=None), ref) > 100 * TOL
    assert max_rel_err(logits_with(logit_softcap=None), ref) > 100 * TOL



@pytest.mark.parametrize("variant", ["gemma2", "gemma3"])
def test_triton_backend_with_window_and_softcap_matches_hf(
        variant: str, arch_dirs: dict[str, Path]) -> None:
    # The Triton paged kernel (the interpreter on CPU, as its other tests): prefill then decodes
    # past the window, softcapped on gemma2.
    pytest.importorskip("triton")
    model_dir = arch_dirs[variant]
    runner = make_runner(model_dir, attention_backend="triton")
    spy = LogitsSpy(runner)
    tokens = prompt(8, 13)
    blocks = Blocks(runner.block_size)
    out = runner.execute_model(step(new=[new_req("a", tokens, blocks.take(0, 13))],
                                    num_scheduled={"a": 13}))
    for _ in range(3):
        ref = hf_logits(model_dir, tokens)[-1]
        assert max_rel_err(spy.last[0], ref) < TOL
        assert out.sampled_token_ids == [[int(ref.argmax())]]
        tokens = tokens + out.sampled_token_ids[0]
        n = len(tokens)
        out = runner.execute_model(step(cached=[("a", blocks.take(n - 1, n), n - 1)],
                                        num_scheduled={"a": 1}))
