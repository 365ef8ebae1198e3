from __future__ import annotations

import pytest
import torch

from benchmarks import roofline
from benchmarks.common import percentiles
from benchmarks.datasets import SampleRequest
from benchmarks.roofline import (
    MachineRates,
    ModelShape,
    fastest_gemm,
    fractions,
    measure_bandwidth,
    measure_gemm,
    measure_gemm_by_library,
    measure_machine,
    workload_bound,
)
from strand.kernels import cpu_linear, cpu_linear_panels

SHAPE = ModelShape(num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4,
                   intermediate_size=16, vocab_size=10)
RATES = MachineRates(gemm_flops_per_s=1e6, memory_bytes_per_s=1e6, gemm_size=0, copy_bytes=0,
                     dtype="float32", num_threads=1)


def test_layer_params_count_qkvo_and_the_gated_mlp() -> None:
    # per layer: q 8x8 + k,v 8x4 each + o 8x8 + 3 x 8x16 = 64 + 64 + 64 + 384
    assert SHAPE.layer_params == 2 * 576
    assert SHAPE.lm_head_params == 80


def test_workload_flops_count_linears_lm_head_and_attention() -> None:
    # prompt 3 + output 2: 4 tokens fed (positions 0..3 attend to 1..4 keys = 10), 2 lm_heads
    bound = workload_bound(RATES, SHAPE, [SampleRequest([5, 6, 7], 2)], batch_size=1)
    expected = 2 * 1152 * 4 + 2 * 80 * 2 + 4 * 2 * 8 * 10
    assert bound["workload"]["flops"] == expected
    assert bound["compute_time_s"] == pytest.approx(expected / 1e6)


def test_memory_time_reads_the_weights_once_per_step() -> None:
    bound = workload_bound(RATES, SHAPE, [SampleRequest([5, 6, 7], 2)], batch_size=1)
    weights = (1152 + 80) * 4
    kv = 2 * 2 * 4 * 4 * 10
    assert bound["workload"]["min_steps"] == 2
    assert bound["memory_time_s"] == pytest.approx((2 * weights + kv) / 1e6)
    assert bound["limited_by"] == "memory"


def test_bound_is_the_slower_of_compute_and_memory() -> None:
    fast_memory = MachineRates(1e6, 1e12, 0, 0, "float32", 1)
    bound = workload_bound(fast_memory, SHAPE, [SampleRequest([5, 6, 7], 2)], batch_size=1)
    assert bound["limited_by"] == "compute"
    assert bound["bound_time_s"] == bound["compute_time_s"]
    assert bound["bound_total_tokens_per_s"] == pytest.approx(5 / bound["compute_time_s"])


def test_fraction_of_bound_is_bound_time_over_elapsed() -> None:
    bound = {"compute_time_s": 2.0, "bound_time_s": 3.0}
    assert fractions(bound, 4.0) == {"fraction_of_compute_bound": 0.5, "fraction_of_bound": 0.75}


def test_measured_rates_are_positive() -> None:
    assert measure_gemm(64, repeats=1) > 0
    assert measure_bandwidth(1024**2, repeats=1) > 0


def test_the_gemm_rate_is_the_fastest_library_measured() -> None:
    rates = measure_gemm_by_library(128, repeats=1)
    libraries = [library for _, library in rates]
    assert libraries[0] == "torch.matmul"
    if cpu_linear.unavailable_reason() is None:  # oneDNN counts too where the engine uses it
        # ... and the engine's packed layout: float32 panels where they are chosen.
        packed = "panels" if cpu_linear_panels.chosen() else "onednn-packed"
        assert {"onednn", packed} <= set(libraries)
    assert all(rate > 0 for rate, _ in rates)


def test_a_bfloat16_bound_counts_the_float32_rate_with_the_weights_converted() -> None:
    # On an AVX2 CPU oneDNN emulates bfloat16 at a tenth of the float32 rate; converting the
    # weights to float32 does the same work faster, so float32 is measured too, and labelled.
    rates = measure_gemm_by_library(64, "bfloat16", repeats=1)
    libraries = [library for _, library in rates]
    assert "torch.matmul" in libraries and "torch.matmul float32" in libraries
    narrow = [name for name in libraries if "float32" not in name]
    # The engine packs float32 weights into panels where they are chosen (bfloat16 stays on
    # oneDNN's packed copy).
    packed32 = "panels float32" if cpu_linear_panels.chosen() else "onednn-packed float32"
    assert {packed32 if name == "onednn-packed" else f"{name} float32"
            for name in narrow} <= set(libraries)
    assert fastest_gemm(64, "bfloat16", repeats=1)[1] in libraries


def test_a_float32_bound_measures_float32_alone() -> None:
    assert not any("float32" in library
                   for _, library in measure_gemm_by_library(64, "float32", repeats=1))


def test_the_fastest_gemm_is_the_highest_rate_and_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    measured = [(1e9, "torch.matmul"), (5e9, "onednn-packed float32"), (2e9, "onednn")]
    monkeypatch.setattr(roofline, "measure_gemm_by_library", lambda *args, **kwargs: measured)
    assert fastest_gemm(64, "bfloat16") == (5e9, "onednn-packed float32")
    rates = measure_machine(64, 1024**2, "bfloat16")
    assert (rates.gemm_flops_per_s, rates.gemm_library) == (5e9, "onednn-packed float32")


def test_an_unknown_gemm_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="gemm dtype must be one of"):
        measure_gemm(64, "int8")


def test_tiny_gemm_is_refused() -> None:
    with pytest.raises(ValueError, match="gemm size must be >= 16"):
        measure_gemm(8)


def test_percentiles_interpolate_linearly() -> None:
    result = percentiles([1.0, 2.0, 3.0, 4.0, 5.0])
    assert result == {"mean": 3.0, "p50": 3.0, "p90": pytest.approx(4.6),
                      "p99": pytest.approx(4.96)}


def test_percentiles_of_nothing_are_zero() -> None:
    assert percentiles([]) == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}


def test_a_slow_first_product_is_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    # Past SLOW_PRODUCT_S the first call's time stands: no minutes of emulated bfloat16.
    monkeypatch.setattr(roofline, "SLOW_PRODUCT_S", 0.0)
    calls: list[int] = []
    real = torch.matmul

    def counting(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(torch, "matmul", counting)
    rates = measure_gemm_by_library(32, "float32", repeats=3)
    assert len(calls) == 1 and rates[0][1] == "torch.matmul" and rates[0][0] > 0
