"""benchmarks/quantized_batch.py: the multiply-adds it counts, llama-batched-bench's row as it
reads it, one tiny run taking turns with a stand-in llama-batched-bench."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

gguf = pytest.importorskip("gguf")

from benchmarks import quantized_batch  # noqa: E402
from benchmarks.common import blocks_holding  # noqa: E402

# llama-batched-bench's table as it prints it (llama.cpp build 0c1e570), one row.
ROW = ("|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |"
       "    S t/s |\n|-------|--------|------|--------|----------|----------|----------|---------"
       "-|----------|----------|\n|   128 |     64 |   32 |   6144 |    4.440 |   922.52 |    "
       "3.849 |   532.06 |    8.289 |   741.20 |")


def test_llama_batched_bench_s_row_is_read_as_the_three_rates() -> None:
    assert quantized_batch.parse_batched_row(ROW) == {
        "prefill_tok_s": 922.52, "decode_tok_s": 532.06, "total_tok_s": 741.2}
    with pytest.raises(ValueError, match="no result row"):
        quantized_batch.parse_batched_row(ROW.splitlines()[0])


def test_one_tiny_run_beside_llama_batched_bench(
        q4_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    fake = bin_dir / "llama-batched-bench"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncat <<"END"\n{ROW}\nEND\n')
    fake.chmod(0o755)
    from strand.engine_core import LLMEngine

    made, added = LLMEngine.from_engine_args, LLMEngine.add_request
    kv_blocks: list[int | None] = []
    peer_runs_at_round: list[int] = []  # llama-batched-bench runs done as each round began

    def recording(engine_args: Any, *rest: Any, **kwargs: Any) -> LLMEngine:
        kv_blocks.append(engine_args.num_gpu_blocks_override)
        return made(engine_args, *rest, **kwargs)

    def adding(engine: LLMEngine, request_id: str, *rest: Any, **kwargs: Any) -> Any:
        if request_id.endswith("-0"):
            peer_runs_at_round.append(
                len(calls.read_text().splitlines()) if calls.exists() else 0)
        return added(engine, request_id, *rest, **kwargs)

    monkeypatch.setattr(LLMEngine, "from_engine_args", staticmethod(recording))
    monkeypatch.setattr(LLMEngine, "add_request", adding)
    out = tmp_path / "r.json"
    quantized_batch.main(["--model", str(q4_file), "--requests", "6", "--prompt", "5",
                          "--tokens", "3", "--threads", "1", "--repeats", "2",
                          "--kv-cache-dtype", "bfloat16", "--llama-cpp", str(bin_dir),
                          "--gemm-size", "256", "--out", str(out)])
    lines = calls.read_text().splitlines()
    assert lines == [f"-m {q4_file} -t 1 -npp 5 -ntg 3 -npl 6 -c 112"] * 2
    # The two take turns: the warm-up, Strand's first timed round, llama.cpp's first run,
    # Strand's second, llama.cpp's second.
    assert peer_runs_at_round == [0, 0, 1]
    # Strand's KV cache holds all 6 requests of 8 tokens at once, as -c does llama.cpp's: a
    # block each and the reserved one.
    assert kv_blocks == [7]
    data = json.loads(out.read_text())
    assert data["kv_cache_dtype"] == "bfloat16"
    strand, llama = data["results"]["strand"], data["results"]["llama.cpp"]
    assert len(strand["runs"]) == 2 and llama["decode_tok_s"] == 532.06
    # The tiny model's linears: 2 layers of qkv (64 -> 128), o, gate_up (64 -> 256), down; the
    # lm_head 64 -> 512 (the vocabulary).
    assert strand["macs"] == [2 * (64 * 128 + 64 * 64 + 64 * 256 + 128 * 64), 64 * 512]
    for key in ("total_tok_s", "prefill_tok_s", "decode_tok_s"):
        assert 0 < strand[key] and 0 < data["bounds"][key]
    for key in ("total_tok_s", "prefill_tok_s", "decode_tok_s"):
        assert strand["turn_ratios"][key] == [
            s[key] / ll[key] for s, ll in zip(strand["runs"], llama["runs"], strict=True)]
    text = capsys.readouterr().out
    assert "Strand / llama.cpp" in text and "bound (linears only)" in text
    assert "turn by turn" in text


@pytest.mark.parametrize("flags", [["--tokens", "1"], ["--requests", "0"]])
def test_bad_sizes_are_refused(q4_file: Path, flags: list[str]) -> None:
    with pytest.raises(SystemExit):
        quantized_batch.main(["--model", str(q4_file), *flags])


def test_a_directory_without_llama_batched_bench_is_refused(q4_file: Path,
                                                           tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        quantized_batch.main(["--model", str(q4_file), "--llama-cpp", str(tmp_path)])


def test_the_kv_cache_holds_whole_blocks_of_every_request_and_the_reserved_one() -> None:
    assert blocks_holding([256] * 32) == 32 * 16 + 1
    assert blocks_holding([8] * 6) == 7
    assert blocks_holding([17]) == 3
    assert blocks_holding([17, 3], block_size=4) == 5 + 1 + 1
