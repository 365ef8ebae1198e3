"""benchmarks/gpu_step_profile.py and gpu_prefill.py on a tiny model on the CPU: the parts of a
step and the prefill work are counted as documented (on a GPU the kernel columns fill in)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import ModuleType

import pytest

from benchmarks import gpu_prefill, gpu_step_profile
from benchmarks.roofline import ModelShape
from tests.benchmarks.conftest import model_flags


def _args(module: ModuleType, model_dir: Path, *extra: str) -> argparse.Namespace:
    small = {gpu_step_profile: ["--batch-size", "2", "--prompt-len", "6", "--steps", "4"],
             gpu_prefill: ["--prompt-len", "12", "--num-prompts", "3", "--repeats", "2",
                           "--gemm-size", "64"]}[module]
    return module.build_parser().parse_args(
        [*model_flags(model_dir), "--device", "cpu", *small, *extra])


def test_step_profile_times_every_part_of_a_decode_step(tiny_model_dir: Path) -> None:
    result = gpu_step_profile.profile(_args(gpu_step_profile, tiny_model_dir))
    assert set(result["parts_ms"]) == {"schedule", "prepare_inputs", "compute_logits", "_sample",
                                       "update_from_output", "rest of step"}
    assert all(v > 0 for k, v in result["parts_ms"].items() if k != "rest of step")
    assert result["wall_ms_per_step"] > 0
    # No CUDA activity on a CPU: the whole step is host time.
    assert result["gpu_busy_ms_per_step"] == 0
    assert result["host_overhead_ms_per_step"] == result["wall_ms_per_step"]


def test_prefill_counts_layers_head_and_causal_attention(tiny_model_dir: Path) -> None:
    shape = ModelShape.from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    flops = gpu_prefill.prefill_flops(shape, 12, 3)
    attention = 4 * shape.num_layers * shape.num_heads * shape.head_dim * (12 * 13 / 2) * 3
    assert flops == pytest.approx(2 * shape.layer_params * 36 + 2 * shape.lm_head_params * 3
                                  + attention)
    result = gpu_prefill.run(_args(gpu_prefill, tiny_model_dir))
    assert result["tokens_per_s"] == pytest.approx(36 / (result["step_ms"] / 1e3))
    assert 0 < result["fraction_of_bound"] == pytest.approx(
        flops / (result["step_ms"] / 1e3) / (result["gemm_tflops"] * 1e12))
