"""benchmarks/decode_profile.py: its timers' arithmetic, one tiny profile of a packed GGUF model,
and its argument checks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from benchmarks import decode_profile
from strand.kernels._cpu_build import KERNELS
from tests.conftest import build_tiny_model
from tests.engine_core.model_executor.gguf_writer import write_gguf


def test_a_part_counts_its_own_time_without_the_parts_inside_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(decode_profile, "_CLOCK", lambda: now[0])
    timers = decode_profile.Timers()
    with timers.part("step"):
        now[0] += 1.0
        with timers.part("layers"):
            now[0] += 5.0
        with timers.part("layers"):
            now[0] += 2.0
        now[0] += 0.5
    timers.end_step(keep=True)
    with timers.part("step"):
        now[0] += 9.0
    timers.end_step(keep=False)  # a prefill step: dropped
    assert timers.steps == [{"step": 1.5, "layers": 7.0}]


@pytest.mark.skipif(KERNELS.module() is None, reason="CPU kernels unavailable")
def test_a_tiny_packed_model_is_profiled_by_part(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_heads=4, num_kv_heads=2,
                                 intermediate_size=128)
    path = tmp_path / "tiny-Q4_1.gguf"
    write_gguf(model_dir, path, "Q4_1")
    threads, module = torch.get_num_threads(), KERNELS.module()
    result = decode_profile.profile(argparse.Namespace(
        model=str(path), quantization="gguf", prompt=4, tokens=5, repeats=1, dtype="float32",
        threads=1))
    assert torch.get_num_threads() == threads and KERNELS.module() is module  # put back
    # The packed lm_head is the stack's: the whole step from token ids to logits is one call.
    parts = {"embedding, layers, final norm, lm_head (fused C++)", "sampler",
             "engine step (scheduler, outputs)"}
    assert parts <= set(result) and all(result[p] > 0 for p in parts)
    assert result["total"] >= max(v for k, v in result.items() if k != "total")


@pytest.mark.parametrize("argv", [["--tokens", "0"], ["--quantization", "awq"]])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        decode_profile.main(argv)
