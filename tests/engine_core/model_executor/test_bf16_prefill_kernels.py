"""bfloat16 prefills through the kernels that round P to bfloat16 (AMX tiles, VDPBF16PS) in the
model: two fresh prompts in one step and a chunked prompt (its second chunk over a cached context),
against HF transformers in float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import strand.kernels.cpu_prefill_attention as cpu_prefill
from strand.engine_core.model_executor.attention import torch_ref
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

# The kernel's test (cpu_prefill_attention's) and what turns the kernels taken before it off.
KERNELS = {
    "amx": ("amx_applies", {}),
    "vdpbf16ps": ("pairs_applies", {"STRAND_DISABLE_AMX": "1"}),
}


@pytest.fixture(scope="module")
def head_dim_64_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 64 (the kernel needs a multiple of 32), GQA 3 as SmolLM2.
    return build_model_dir(tmp_path_factory.mktemp("llama-hd64"), hidden_size=192, num_heads=3,
                           num_kv_heads=1)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_bfloat16_prefills_stay_close_to_fp32_hf(
        head_dim_64_dir: Path, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, env = KERNELS[kernel]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    real = getattr(cpu_prefill, name)
    if not real(torch.bfloat16, 64):
        pytest.skip(f"{kernel} does not run here (the CPU, or a lower STRAND_CPU_ISA)")
    calls: list[int] = []

    def spy(dtype: torch.dtype, head_dim: int) -> bool:
        applies = real(dtype, head_dim)
        calls.append(int(applies))
        return applies

    monkeypatch.setattr(cpu_prefill, name, spy)
    # Fresh prompts to the kernel as well, on any vendor (Intel CPUs without AMX send them to
    # SDPA: fresh_sdpa_applies).
    monkeypatch.setattr(torch_ref, "fresh_sdpa_applies", lambda dtype, head_dim: False)
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
    assert sum(calls) >= 3 * 2  # every layer of the three prefill steps (2 layers each)
    for ours, tokens in ((both[0], a), (both[1], b), (chunked[0], c)):
        assert ours.dtype == torch.bfloat16
        assert max_rel_err(ours, hf_logits(head_dim_64_dir, tokens)[-1]) < 5e-2
