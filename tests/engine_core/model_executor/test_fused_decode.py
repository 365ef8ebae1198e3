"""A decode step of a few requests through each layer as one C++ call (models/llama_fused_decode.py):
the same tokens and the same logprobs, bit for bit, as the layer-by-layer path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import EngineArgs, LLMEngine, SamplingParams
from strand.engine_core.model_executor.models import llama_fused_decode as fused_decode
from strand.engine_core.outputs import RequestOutput
from strand.kernels import cpu_linear, cpu_linear_batch, cpu_linear_panels
from strand.kernels._cpu_build import KERNELS
from strand.testing.tiny_model import LLAMA3_ROPE_SCALING
from tests.conftest import build_tiny_model
from tests.engine_core.model_executor.conftest import count_fused_calls

pytestmark = pytest.mark.skipif(KERNELS.module() is None,
                                reason=f"CPU kernels unavailable: {KERNELS.unavailable_reason()}")

VARIANTS = {"llama": {}, "qwen2": {"arch": "qwen2", "tie_word_embeddings": True},
            "llama3_rope_tied": {"rope_scaling": LLAMA3_ROPE_SCALING, "rope_theta": 500000.0,
                                 "tie_word_embeddings": True}}
PROMPTS = [[5, 9, 13, 200, 7], [3, 3, 3], [100, 101, 102, 103, 104, 105, 106, 107, 108], [42],
           [17, 18, 19, 20], [250, 1, 250, 2], [60, 61]]


def _batches_fused(dtype: str) -> bool:
    """Whether decode batches past 4 requests take the fused call here: the packed weights
    handed to the stack (float32 panels, for bfloat16 layers too; or oneDNN's copies in the
    model's dtype), or linear_batch taking the dtype."""
    return (cpu_linear_panels.chosen() or cpu_linear_batch.takes(getattr(torch, dtype))
            or cpu_linear.unavailable_reason(getattr(torch, dtype)) is None)


def _generate(model_dir: Path, dtype: str, num_requests: int,
              fused: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[object], list[str]]:
    calls: list[str] = []
    if fused:
        count_fused_calls(monkeypatch, calls)
    else:
        monkeypatch.setattr(fused_decode, "applies", lambda *a: False)
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(model_dir), dtype=dtype,
                                                   device="cpu", block_size=4, num_gpu_blocks_override=64))
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS[:num_requests]):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                c = out.outputs[0]
                finished[out.request_id] = (c.token_ids, [
                    {t: lp.logprob for t, lp in step.items()} for step in (c.logprobs or [])])
    monkeypatch.undo()
    return [finished[k] for k in sorted(finished)], calls


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
    # Up to 4 decodes a step take the fused call, the final norm and the lm_head included (a
    # dense head on the few-row kernel); more with the kernel the layers would call for them:
    # the panels (AVX2 or AVX-512), else oneDNN's packed weights or linear_batch.
    assert set(calls) <= {"logits"}
    assert bool(calls) == (num_requests <= 4 or _batches_fused("float32"))


@pytest.mark.parametrize("keep_dense", ["0", "1"])
@pytest.mark.parametrize("num_requests", [2, 7])
def test_fused_decode_in_bfloat16(model_dirs: dict[str, Path], num_requests: int,
                                  keep_dense: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The bfloat16 panels alone, and beside the dense weight (STRAND_KEEP_DENSE_WEIGHTS=1: the
    # few-row kernel on the dense copy, the panels handed to the stack for batches).
    monkeypatch.setenv("STRAND_KEEP_DENSE_WEIGHTS", keep_dense)
    fused, calls = _generate(model_dirs["llama"], "bfloat16", num_requests, True, monkeypatch)
    plain, _ = _generate(model_dirs["llama"], "bfloat16", num_requests, False, monkeypatch)
    assert fused == plain
    assert bool(calls) == (num_requests <= 4 or _batches_fused("bfloat16"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("num_requests", [1, 3])
def test_the_phased_dense_step_splits_its_work_between_threads_bit_for_bit(
        model_dirs: dict[str, Path], dtype: str, num_requests: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Every projection is dense, so the C++ step runs as phases whose chunks (groups of weight
    # rows, attention tasks) any thread takes (strand/kernels/csrc/decode_phased.cpp): 3 threads (more
    # than one request's kv heads, as many as 3 requests), one thread, the op-by-op C++ step
    # (STRAND_DECODE_PHASED=0) and the layer-by-layer path must give the same bits.
    import os

    import torch

    model_dir = model_dirs["llama"]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        three, calls = _generate(model_dir, dtype, num_requests, True, monkeypatch)
        torch.set_num_threads(1)
        one, _ = _generate(model_dir, dtype, num_requests, True, monkeypatch)
        os.environ["STRAND_DECODE_PHASED"] = "0"  # read when a stack is made: a new engine's
        op_by_op, _ = _generate(model_dir, dtype, num_requests, True, monkeypatch)
    finally:
        torch.set_num_threads(threads)
        os.environ.pop("STRAND_DECODE_PHASED", None)
    plain, _ = _generate(model_dir, dtype, num_requests, False, monkeypatch)
    assert calls and set(calls) == {"logits"}
    assert three == one == op_by_op == plain


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


def _one_layer_stack() -> Any:
    import torch

    module = KERNELS.module()
    assert module is not None
    stack = module.DecodeStack(torch.zeros(8, 4), 2, 1, 4, 1e-6, 0.5)
    stack.add_layer(torch.ones(16), torch.zeros(16, 16), None, torch.zeros(16, 8), None,
                    torch.ones(16), torch.zeros(64, 16), torch.zeros(16, 32), [0, 0, 0, 0])
    return stack


def _step(ids: list[int], positions: list[int], slots: list[int], table: list[list[int]],
          seq_lens: list[int]) -> tuple[Any, ...]:
    """A logits() call's arguments over one layer's cache of 2 blocks of 4 slots."""
    import torch

    return (torch.tensor(ids), torch.tensor(positions), [torch.zeros(2, 2, 4, 1, 4)],
            torch.tensor(slots), torch.tensor(table, dtype=torch.int32),
            torch.tensor(seq_lens, dtype=torch.int32))


def test_the_stack_gives_logits_from_token_ids_once_it_holds_the_ends() -> None:
    import torch

    stack = _one_layer_stack()
    step = _step([3], [0], [0], [[0]], [1])
    with pytest.raises(RuntimeError, match=r"needs set_ends\(\) first"):
        stack.logits(*step)
    table = torch.linspace(-2.0, 3.0, 5 * 16).view(5, 16)
    with pytest.raises(RuntimeError, match="final norm must be 16 values"):
        stack.set_ends(table, torch.ones(8), torch.zeros(10, 16), 0, 1e-6, 5, 10)
    with pytest.raises(RuntimeError, match=r"embedding table must be a contiguous \[5, 16\]"):
        stack.set_ends(table[:, :8], torch.ones(16), torch.zeros(10, 16), 0, 1e-6, 5, 10)
    with pytest.raises(RuntimeError, match=r"dense lm_head must be \[10, 16\]"):
        stack.set_ends(table, torch.ones(16), torch.zeros(10, 8), 0, 1e-6, 5, 10)
    with pytest.raises(RuntimeError, match="GGUF embedding table must be contiguous uint8 rows"):
        stack.set_ends(torch.zeros(4, 34, dtype=torch.uint8), torch.ones(16), torch.zeros(10, 16),
                       0, 1e-6, 5, 10, 8)  # Q8_0 rows, one fewer than the vocabulary
    with pytest.raises(RuntimeError, match="Q4_1=3"):  # a GGML type the kernels do not take
        stack.set_ends(table, torch.ones(16), torch.zeros(10, 18, dtype=torch.uint8), 11, 1e-6, 5, 10)
    stack.set_ends(table, torch.full((16,), 2.0), torch.eye(10, 16), 0, 1e-6, 5, 10)
    # Zero projections: every layer adds 0 to the residual stream (token 3's embedding row),
    # which the final norm (weight 2) scales and the lm_head's identity rows take 10 values of.
    hidden = table[3:4]
    want = 2.0 * hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(stack.logits(*step), want[:, :10])


@pytest.mark.parametrize("rows", [1, 6])
def test_the_stack_reads_a_tied_heads_panels_as_its_embedding_table_and_its_head(
        rows: int) -> None:
    """Float32 panels as the only copy (layers/linear.py): the embedding rows gathered from
    them and the head's product on them give what the dense table and head give."""
    import torch

    if not cpu_linear_panels.chosen():
        pytest.skip("no float32 panels on this CPU level")
    table = torch.linspace(-2.0, 3.0, 10 * 16).view(10, 16)
    panels = cpu_linear_panels.pack(table)
    step = (torch.tensor([3, 9, 0, 4, 4, 7][:rows]), torch.zeros(rows, dtype=torch.int64),
            [torch.zeros(2, 2, 4, 1, 4)], torch.arange(rows),
            torch.zeros(rows, 1, dtype=torch.int32), torch.ones(rows, dtype=torch.int32))
    dense, packed = _one_layer_stack(), _one_layer_stack()
    dense.set_ends(table, torch.full((16,), 2.0), table, 0, 1e-6, 10, 10)
    with pytest.raises(RuntimeError, match=r"embedding table must be a contiguous \[100, 16\]"):
        packed.set_ends(panels, torch.full((16,), 2.0), panels, 0, 1e-6, 100, 10)
    packed.set_ends(panels, torch.full((16,), 2.0), panels, 0, 1e-6, 10, 10)
    if rows > 4:
        dense.set_batch_weights(_zero_panels(), cpu_linear_panels.pack(table))
        packed.set_batch_weights(_zero_panels(), panels)
    torch.testing.assert_close(packed.logits(*step), dense.logits(*step))
    hidden = table[step[0]]
    want = 2.0 * hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6) @ table.T
    torch.testing.assert_close(packed.logits(*step), want, rtol=1e-5, atol=1e-4)


def _zero_panels() -> list[torch.Tensor]:
    """_one_layer_stack's four zero weights as panels."""
    return [cpu_linear_panels.pack(torch.zeros(*shape))
            for shape in ((16, 16), (16, 8), (64, 16), (16, 32))]


def test_the_stack_takes_onednn_weights_for_batches_past_four_rows() -> None:
    import torch

    stack = _one_layer_stack()
    zeros = [torch.zeros(16, 16), torch.zeros(16, 8), torch.zeros(64, 16), torch.zeros(16, 32)]
    with pytest.raises(RuntimeError, match=r"4 weights a layer \(4\), got 3"):
        stack.set_batch_weights(zeros[:3])
    with pytest.raises(RuntimeError, match=r"needs set_ends\(\) with a dense lm_head first"):
        stack.set_batch_weights(zeros, torch.eye(10, 16))
    with pytest.raises(RuntimeError, match=r"packed\[0\] must be in the layers' dtype"):
        stack.set_batch_weights([w.double() for w in zeros])
    if cpu_linear.unavailable_reason(torch.float32) is not None:
        pytest.skip(f"oneDNN linear unavailable: {cpu_linear.unavailable_reason(torch.float32)}")
    table = torch.linspace(-2.0, 3.0, 5 * 16).view(5, 16)
    stack.set_ends(table, torch.full((16,), 2.0), torch.eye(10, 16), 0, 1e-6, 5, 10)
    packed = [cpu_linear.pack_weight(w) for w in zeros]
    stack.set_batch_weights(packed, cpu_linear.pack_weight(torch.eye(10, 16)))
    # Six requests, one slot each: zero projections leave each token's embedding row, which the
    # final norm scales and the lm_head's identity rows (oneDNN's packed copy) take 10 values of.
    ids = [0, 1, 2, 3, 4, 3]
    step = (torch.tensor(ids), torch.zeros(6, dtype=torch.int64), [torch.zeros(2, 2, 4, 1, 4)],
            torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([[0], [0], [0], [0], [1], [1]],
                                                           dtype=torch.int32),
            torch.ones(6, dtype=torch.int32))
    hidden = table[ids]
    want = 2.0 * hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(stack.logits(*step), want[:, :10])


@pytest.mark.parametrize(("step", "message"), [
    (([5], [0], [0], [[0]], [1]), r"input_ids must be in \[0, 5\) \(the vocabulary\), got 5"),
    (([0], [8], [0], [[0]], [1]), r"positions must be in \[0, 8\) \(the rotary"),
    (([0], [0], [8], [[0]], [1]), r"slot_mapping must be in \[0, 8\) \(the cache's slots\)"),
    (([0], [0], [0], [[2]], [1]), r"block_table entries must be in \[0, 2\)"),
    (([0], [0], [0], [[0]], [5]), r"seq_lens must be in \[1, 5\) \(what block_table covers"),
    (([0], [0], [0], [[0]], [0]), r"seq_lens must be in \[1, 5\)"),
])
def test_the_stack_refuses_a_step_index_out_of_range_before_any_kernel_reads_it(
        step: tuple[Any, ...], message: str) -> None:
    import torch

    stack = _one_layer_stack()
    stack.set_ends(torch.zeros(5, 16), torch.ones(16), torch.zeros(10, 16), 0, 1e-6, 5, 10)
    with pytest.raises(ValueError, match=message):
        stack.logits(*_step(*step))
