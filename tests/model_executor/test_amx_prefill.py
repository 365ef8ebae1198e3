"""bfloat16 prefills on AMX tiles in the model: two fresh prompts in one step and a chunked
prompt (its second chunk over a cached context), against HF transformers in float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kernels.cpu_prefill_attention as cpu_prefill
from tests.model_executor.conftest import (
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

pytestmark = pytest.mark.skipif(not cpu_prefill.amx_applies(torch.bfloat16, 64),
                                reason="no AMX-BF16 here (or a lower STRAND_CPU_ISA)")


@pytest.fixture(scope="module")
def head_dim_64_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 64 (the kernel needs a multiple of 32), GQA 3 as SmolLM2.
    return build_model_dir(tmp_path_factory.mktemp("llama-hd64"), hidden_size=192, num_heads=3,
                           num_kv_heads=1)


def test_bfloat16_prefills_on_amx_stay_close_to_fp32_hf(
        head_dim_64_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    amx_calls: list[int] = []
    real = cpu_prefill.amx_applies

    def spy(dtype: torch.dtype, head_dim: int) -> bool:
        applies = real(dtype, head_dim)
        amx_calls.append(int(applies))
        return applies

    monkeypatch.setattr(cpu_prefill, "amx_applies", spy)
    runner = make_runner(head_dim_64_dir, dtype="bfloat16", block_size=16)
    logits = LogitsSpy(runner)
    blocks = Blocks(runner.block_size)
    a, b, c = prompt(1, 37), prompt(2, 21), prompt(3, 50)
    runner.execute_model(step(new=[new_req("a", a, blocks.take(0, 37)),
                                   new_req("b", b, blocks.take(0, 21))],
                              num_scheduled={"a": 37, "b": 21}))
    both = logits.last
    runner.execute_model(step(new=[new_req("c", c, blocks.take(0, 50))], num_scheduled={"c": 20}))
    runner.execute_model(step(cached=[("c", [], 20)], num_scheduled={"c": 30}))
    chunked = logits.last
    assert sum(amx_calls) >= 3 * 2  # every layer of the three prefill steps (2 layers each)
    for ours, tokens in ((both[0], a), (both[1], b), (chunked[0], c)):
        assert ours.dtype == torch.bfloat16
        assert max_rel_err(ours, hf_logits(head_dim_64_dir, tokens)[-1]) < 5e-2
