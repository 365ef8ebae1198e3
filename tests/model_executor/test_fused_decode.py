"""A decode step of a few requests through each layer as one C++ call (layers/fused_decode.py):
the same tokens and the same logprobs, bit for bit, as the layer-by-layer path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine_core import EngineArgs, LLMEngine, SamplingParams
from engine_core.model_executor.layers import fused_decode
from engine_core.model_executor.tiny_model import LLAMA3_ROPE_SCALING
from kernels import cpu_linear_batch
from kernels._cpu_build import KERNELS
from tests.conftest import build_tiny_model

pytestmark = pytest.mark.skipif(KERNELS.module() is None,
                                reason=f"CPU kernels unavailable: {KERNELS.unavailable_reason()}")

VARIANTS = {"llama": {}, "qwen2": {"arch": "qwen2", "tie_word_embeddings": True},
            "llama3_rope_tied": {"rope_scaling": LLAMA3_ROPE_SCALING, "rope_theta": 500000.0,
                                 "tie_word_embeddings": True}}
PROMPTS = [[5, 9, 13, 200, 7], [3, 3, 3], [100, 101, 102, 103, 104, 105, 106, 107, 108], [42],
           [17, 18, 19, 20], [250, 1, 250, 2], [60, 61]]


def _generate(model_dir: Path, dtype: str, num_requests: int,
              fused: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[object], int]:
    calls: list[int] = []
    real_forward = fused_decode.forward

    def counting_forward(*args: Any) -> Any:
        calls.append(1)
        return real_forward(*args)

    if fused:
        monkeypatch.setattr(fused_decode, "forward", counting_forward)
    else:
        monkeypatch.setattr(fused_decode, "applies", lambda *a: False)
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(model_dir), dtype=dtype,
                                                   block_size=4, num_gpu_blocks_override=64))
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS[:num_requests]):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                c = out.outputs[0]
                finished[out.request_id] = (c.token_ids, [
                    {t: lp.logprob for t, lp in step.items()} for step in (c.logprobs or [])])
    monkeypatch.undo()
    return [finished[k] for k in sorted(finished)], len(calls)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: build_tiny_model(tmp_path_factory.mktemp(name), **spec)
            for name, spec in VARIANTS.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("num_requests", [1, 3, 7])
def test_fused_decode_gives_the_layer_by_layer_outputs_bit_for_bit(
        model_dirs: dict[str, Path], variant: str, num_requests: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = model_dirs[variant]
    fused, calls = _generate(model_dir, "float32", num_requests, True, monkeypatch)
    plain, _ = _generate(model_dir, "float32", num_requests, False, monkeypatch)
    assert fused == plain
    # Up to 4 decodes a step take the fused call; more only where linear_batch takes their
    # projections (STRAND_CPU_ISA=avx2: CI's second run), never through oneDNN.
    assert (calls > 0) == (num_requests <= 4 or cpu_linear_batch.chosen())


@pytest.mark.parametrize("num_requests", [2, 7])
def test_fused_decode_in_bfloat16(model_dirs: dict[str, Path], num_requests: int,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fused, calls = _generate(model_dirs["llama"], "bfloat16", num_requests, True, monkeypatch)
    plain, _ = _generate(model_dirs["llama"], "bfloat16", num_requests, False, monkeypatch)
    assert fused == plain
    assert (calls > 0) == (num_requests <= 4 or cpu_linear_batch.chosen())


def test_a_bad_position_is_refused_before_any_kernel_reads_the_table() -> None:
    import torch

    with pytest.raises(ValueError, match=r"positions must be in \[0, 8\)"):
        fused_decode._check_step(torch.tensor([3, 8]), torch.tensor([0, 1]), torch.zeros(8, 4),
                                 torch.zeros(2, 4, 4, 1, 4), None)  # type: ignore[arg-type]


def test_the_stack_takes_layers_of_one_size_and_a_cache_per_layer() -> None:
    import torch

    module = KERNELS.module()
    assert module is not None
    stack = module.DecodeStack(torch.zeros(8, 4), 2, 1, 4, 1e-6, 0.5)

    def add(hidden: int, intermediate: int) -> None:
        stack.add_layer(torch.ones(hidden), torch.zeros(16, hidden), None,
                        torch.zeros(hidden, 8), None, torch.ones(hidden),
                        torch.zeros(2 * intermediate, hidden),
                        torch.zeros(hidden, intermediate), [0, 0, 0, 0])

    add(16, 32)
    with pytest.raises(RuntimeError, match="first one's hidden and intermediate sizes"):
        add(16, 24)
    with pytest.raises(RuntimeError, match="one kv cache per layer: 1, got 2"):
        stack.forward(torch.zeros(1, 16), torch.zeros(1, dtype=torch.int64),
                      [torch.zeros(2, 1, 4, 1, 4)] * 2, torch.zeros(1, dtype=torch.int64),
                      torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="1 to 64 rows, got 65"):
        stack.forward(torch.zeros(65, 16), torch.zeros(65, dtype=torch.int64),
                      [torch.zeros(2, 1, 4, 1, 4)], torch.zeros(65, dtype=torch.int64),
                      torch.zeros(65, 1, dtype=torch.int32), torch.ones(65, dtype=torch.int32))
