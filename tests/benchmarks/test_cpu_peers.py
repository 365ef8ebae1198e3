"""benchmarks/cpu_peers.py: reading llama.cpp's own tools' output, and the summary maths."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import cpu_peers, roofline

# llama-bench -o json, trimmed to the fields read (two tests: pp512 and tg128).
LLAMA_BENCH_JSON = json.dumps([
    {"build_commit": "abc1234", "n_prompt": 512, "n_gen": 0, "n_threads": 2,
     "avg_ts": 352.1, "stddev_ts": 3.0, "samples_ts": [349.0, 352.1, 355.2]},
    {"build_commit": "abc1234", "n_prompt": 0, "n_gen": 128, "n_threads": 2,
     "avg_ts": 28.4, "stddev_ts": 0.2, "samples_ts": [28.2, 28.4, 28.6]},
])

BATCHED_BENCH = """
main: n_kv_max = 8256, n_batch = 2048, n_ubatch = 512, flash_attn = 0, is_pp_shared = 0, n_gpu_layers = -1, n_threads = 2, n_threads_batch = 2

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   128 |    128 |   32 |   8192 |   11.742 |   348.84 |   23.901 |   171.37 |   35.643 |   229.84 |

llama_perf_context_print:        load time =     120.44 ms
"""


def test_llama_bench_json_gives_decode_and_prefill_samples() -> None:
    got = cpu_peers.parse_llama_bench(LLAMA_BENCH_JSON)
    assert got == {"prefill": [349.0, 352.1, 355.2], "decode": [28.2, 28.4, 28.6]}


def test_batched_bench_throughput_is_output_tokens_over_total_time() -> None:
    assert cpu_peers.parse_batched_bench(BATCHED_BENCH) == pytest.approx(128 * 32 / 35.643)


def test_batched_bench_without_a_result_row_is_an_error() -> None:
    with pytest.raises(ValueError, match="no result row"):
        cpu_peers.parse_batched_bench("main: n_kv_max = 8256\nerror: failed to load model\n")


def test_median_and_spread() -> None:
    assert cpu_peers._median([3.0, 1.0, 2.0]) == {"median": 2.0, "stdev": 1.0, "runs": 3}
    assert cpu_peers._median([5.0])["stdev"] == 0.0


def test_the_table_states_ratios_against_llama_cpp_and_the_bounds(
        capsys: pytest.CaptureFixture[str]) -> None:
    def result(decode: float, batch: float, prefill: float) -> dict[str, dict[str, float]]:
        return {w: {"median": v, "stdev": 0.0, "runs": 1}
                for w, v in zip(cpu_peers.WORKLOADS, (decode, batch, prefill), strict=True)}

    report = {"dtype": "float32", "threads": 2, "llama_cpp_build": "abc1234",
              "bounds": {"decode_tok_s": 40.0, "prefill_tok_s": 500.0, "weight_bytes": 5.4e8,
                         "bandwidth_bytes_per_s": 2.2e10, "gemm_flops_per_s": 1.1e11},
              "results": {"llama.cpp": result(20.0, 100.0, 300.0),
                          "strand": result(30.0, 200.0, 360.0)}}
    cpu_peers.print_table(report)
    out = capsys.readouterr().out
    assert "30.0 ± 0.0 (1.50x)" in out and "200.0 ± 0.0 (2.00x)" in out
    assert "decode 75% of its bound, prefill 72% of its bound" in out


def test_the_benchmark_needs_the_llama_cpp_side(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cpu_peers.main(["--hf-dir", "x"])
    assert "--gguf and --llama-cpp are needed" in capsys.readouterr().err


def test_ratios_pair_each_round_with_the_peer_of_the_same_round() -> None:
    def one(decode: float) -> dict[str, float]:
        return {"decode": decode, "batch32": 2 * decode, "prefill": 4 * decode}

    # The machine got 2x slower in round 2 for both: the paired ratio stays 1.5.
    rounds = [{"llama.cpp": one(10.0), "strand": one(15.0)},
              {"llama.cpp": one(5.0), "strand": one(7.5)}]
    ratios = cpu_peers.paired_ratios(rounds, "strand")
    assert ratios == {"decode": [1.5, 1.5], "batch32": [1.5, 1.5], "prefill": [1.5, 1.5]}


def test_a_prefill_only_run_prints_and_bounds_prefill_alone(
        capsys: pytest.CaptureFixture[str]) -> None:
    report = {"dtype": "float32", "threads": 2, "llama_cpp_build": "abc1234",
              "workloads": ["prefill"],
              "bounds": {"decode_tok_s": 40.0, "prefill_tok_s": 1600.0, "weight_bytes": 5.4e8,
                         "bandwidth_bytes_per_s": 2.2e10, "gemm_flops_per_s": 3.5e11},
              "results": {"llama.cpp": {"prefill": {"median": 750.0, "stdev": 0.0, "runs": 1}},
                          "strand": {"prefill": {"median": 1120.0, "stdev": 0.0, "runs": 1}}}}
    cpu_peers.print_table(report)
    out = capsys.readouterr().out
    assert "prefill 512 tok/s" in out and "decode bs=1" not in out
    assert "1120.0 ± 0.0 (1.49x)" in out
    assert "strand: prefill 70% of its bound" in out and "decode" not in out.split("strand:")[-1]


def test_the_prefill_bound_uses_the_fastest_gemm_and_the_table_names_it(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # bfloat16 under AVX2: oneDNN's emulated bfloat16 GEMM is slower than float32 on converted
    # weights, so the bound is the float32 rate and says so.
    monkeypatch.setattr(roofline, "fastest_gemm", lambda size, dtype: (4e11, "onednn float32"))
    monkeypatch.setattr(roofline, "measure_bandwidth", lambda: 2e10)
    bound = cpu_peers.bounds(str(tiny_model_dir), "bfloat16", 1)
    shape = roofline.ModelShape.from_config(json.loads(
        (tiny_model_dir / "config.json").read_text()))
    assert bound["gemm_library"] == "onednn float32"
    assert bound["prefill_tok_s"] == pytest.approx(4e11 / (2 * shape.layer_params))
    report = {"dtype": "bfloat16", "threads": 2, "llama_cpp_build": "abc1234",
              "workloads": ["prefill"], "bounds": bound,
              "results": {"llama.cpp": {"prefill": {"median": 1.0, "stdev": 0.0, "runs": 1}},
                          "strand": {"prefill": {"median": 2.0, "stdev": 0.0, "runs": 1}}}}
    cpu_peers.print_table(report)
    assert "GEMM 400 GFLOP/s, onednn float32)" in capsys.readouterr().out


def test_workloads_are_checked_and_kept_in_table_order() -> None:
    with pytest.raises(SystemExit):
        cpu_peers.main(["--hf-dir", "x", "--workloads", "nonsense"])
    ratios = cpu_peers.paired_ratios([{"llama.cpp": {"prefill": 500.0},
                                       "strand": {"prefill": 750.0}}], "strand",
                                     workloads=("prefill",))
    assert ratios == {"prefill": [1.5]}


def test_a_worker_times_only_the_workloads_asked_after_a_warm_up() -> None:
    calls: list[tuple[str, int]] = []

    def measure(name: str):  # type: ignore[no-untyped-def]
        def run(seed: int) -> float:
            calls.append((name, seed))
            return 10.0 + seed
        return run

    args = argparse.Namespace(repeats=2, workloads=["prefill"])
    got = cpu_peers._repeat(args, {w: measure(w) for w in cpu_peers.WORKLOADS})
    assert got == {"prefill": [11.0, 12.0]}  # run 0 was the warm-up
    assert calls == [("prefill", 0), ("prefill", 1), ("prefill", 2)]


def test_bounds_are_measured_every_round_and_fractions_paired_with_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Round 2's machine copied twice as fast: its decode bound doubled, and Strand's fraction
    # of it is that round's result over that round's bound, not over a bound from elsewhere.
    def bound(bandwidth: float, gemm: float) -> dict[str, Any]:
        return {"weight_bytes": 5e8, "bandwidth_bytes_per_s": bandwidth,
                "gemm_flops_per_s": gemm, "gemm_library": "onednn",
                "decode_tok_s": bandwidth / 5e8, "prefill_tok_s": gemm / 1e9}

    round_bounds = [bound(2e10, 4e11), bound(4e10, 4e11), bound(3e10, 5e11)]
    rounds = [{"llama.cpp": {"decode": 20.0, "prefill": 300.0},
               "strand": {"decode": d, "prefill": p}}
              for d, p in ((30.0, 280.0), (40.0, 300.0), (45.0, 350.0))]
    fractions = cpu_peers.paired_fractions(rounds, round_bounds)
    assert fractions["decode"] == pytest.approx([0.75, 0.5, 0.75])
    assert fractions["prefill"] == pytest.approx([0.7, 0.75, 0.7])
    merged = cpu_peers.median_bounds(round_bounds)
    assert merged["bandwidth_bytes_per_s"] == 3e10
    assert merged["bandwidth_bytes_per_s_range"] == [2e10, 4e10]
    assert merged["gemm_library"] == "onednn"

    def result(d: float, p: float) -> dict[str, dict[str, float]]:
        return {"decode": {"median": d, "stdev": 0.0, "runs": 3},
                "prefill": {"median": p, "stdev": 0.0, "runs": 3}}

    cpu_peers.print_table({
        "dtype": "float32", "threads": 2, "llama_cpp_build": "abc1234",
        "workloads": ["decode", "prefill"], "bounds": merged, "bound_fractions": fractions,
        "results": {"llama.cpp": result(20.0, 300.0), "strand": result(40.0, 300.0)}})
    out = capsys.readouterr().out
    assert "30.0 GB/s copy rate [20.0-40.0]" in out and "GEMM 400 GFLOP/s [400.0-500.0]" in out
    assert "decode 75% [75%, 50%, 75%] of its bound" in out
    assert "prefill 70% [70%, 75%, 70%] of its bound" in out


@pytest.mark.parametrize(("dtype", "matched", "bench_flags", "batched_flags"), [
    ("float32", False, [], []),
    ("float32", True, [], ["-ctk", "f32", "-ctv", "f32"]),  # llama-bench takes no f32
    ("bfloat16", True, ["-ctk", "bf16", "-ctv", "bf16"], ["-ctk", "bf16", "-ctv", "bf16"]),
])
def test_llama_cpp_keeps_its_float16_cache_or_strand_s_dtype_when_matched(
        monkeypatch: pytest.MonkeyPatch, dtype: str, matched: bool, bench_flags: list[str],
        batched_flags: list[str]) -> None:
    commands: list[list[str]] = []

    def fake_run(command: list[str], **_: Any) -> argparse.Namespace:
        commands.append(command)
        out = LLAMA_BENCH_JSON if command[0].endswith("llama-bench") else BATCHED_BENCH
        return argparse.Namespace(stdout=out, stderr="")

    monkeypatch.setattr(cpu_peers.subprocess, "run", fake_run)
    args = argparse.Namespace(llama_cpp="/opt/llama", gguf="m.gguf", threads=2, dtype=dtype,
                              workloads=list(cpu_peers.WORKLOADS))
    results, _ = cpu_peers.llama_cpp(args, 1, matched_kv=matched)
    assert set(results) == set(cpu_peers.WORKLOADS)
    assert [c[0] for c in commands] == ["/opt/llama/llama-bench", "/opt/llama/llama-batched-bench"]
    for command, flags in zip(commands, (bench_flags, batched_flags), strict=True):
        assert ("-ctk" in command) == bool(flags)
        if flags:
            assert command[-4:] == flags


def test_llama_cpp_kv_runs_only_when_asked_and_strand_is_also_put_against_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cpu_peers.LLAMA_KV in cpu_peers.BACKENDS
    assert cpu_peers.LLAMA_KV not in cpu_peers.DEFAULT_BACKENDS

    def result(batch: float) -> dict[str, dict[str, float]]:
        return {"batch32": {"median": batch, "stdev": 0.0, "runs": 2}}

    rounds = [{"llama.cpp": {"batch32": 200.0}, "llama.cpp-kv": {"batch32": 100.0},
               "strand": {"batch32": 300.0}},
              {"llama.cpp": {"batch32": 210.0}, "llama.cpp-kv": {"batch32": 120.0},
               "strand": {"batch32": 312.0}}]
    report = {"dtype": "float32", "threads": 2, "llama_cpp_build": "abc1234",
              "workloads": ["batch32"], "rounds": rounds,
              "bounds": {"decode_tok_s": 40.0, "prefill_tok_s": 500.0, "weight_bytes": 5.4e8,
                         "bandwidth_bytes_per_s": 2.2e10, "gemm_flops_per_s": 1.1e11},
              "results": {"llama.cpp": result(205.0), "llama.cpp-kv": result(110.0),
                          "strand": result(306.0)}}
    cpu_peers.print_table(report)
    out = capsys.readouterr().out
    assert "its defaults: a float16 K/V cache" in out
    assert "strand: " not in out  # the batch has no bound: no empty line for one
    # Same-round ratios: 300 / 100 and 312 / 120, median 2.8.
    assert ("llama.cpp-kv: llama.cpp with its K/V cache as Strand keeps it (f32 in "
            "llama-batched-bench; llama-bench takes no f32 cache: float16 there); strand "
            "against it: batch32 2.80x") in out
    cpu_peers.print_table({**report, "dtype": "bfloat16"})
    assert "as Strand keeps it (bf16); strand against it: batch32 2.80x" in capsys.readouterr().out


def test_strand_with_a_bfloat16_cache_runs_only_when_asked_and_only_under_float32(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert cpu_peers.STRAND_BF16_KV not in cpu_peers.DEFAULT_BACKENDS
    commands: list[list[str]] = []

    def fake_run(command: list[str], **_: Any) -> argparse.Namespace:
        commands.append(command)
        return argparse.Namespace(returncode=0, stdout='{"results": {}, "isa": {}}\n', stderr="")

    monkeypatch.setattr(cpu_peers.subprocess, "run", fake_run)
    args = argparse.Namespace(hf_dir="m", dtype="float32", threads=2, workloads=["batch32"],
                              isa="native")
    kind, env = cpu_peers.BACKENDS[cpu_peers.STRAND_BF16_KV]
    cpu_peers._worker(kind, args, env, 1, cpu_peers.KV_CACHE_DTYPES[cpu_peers.STRAND_BF16_KV])
    cpu_peers._worker("strand", args, {}, 1)
    assert [c[c.index("--kv-cache-dtype") + 1] for c in commands] == ["bfloat16", "auto"]
    with pytest.raises(SystemExit):
        cpu_peers.main(["--hf-dir", "m", "--gguf", "m.gguf", "--llama-cpp", "bin", "--dtype",
                        "bfloat16", "--backends", cpu_peers.STRAND_BF16_KV])
    assert "strand-bf16kv is strand itself under --dtype bfloat16" in capsys.readouterr().err
