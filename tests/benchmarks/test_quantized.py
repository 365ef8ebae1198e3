"""benchmarks/quantized.py: the Q8_0 copy it makes, the bytes it counts, one tiny run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

from benchmarks import quantized  # noqa: E402
from strand.kernels import cpu_linear_panels  # noqa: E402


def test_requantize_turns_4_bit_tensors_into_q8_0_and_keeps_the_rest(
        q4_file: Path, tmp_path: Path) -> None:
    out = quantized.requantize(q4_file, tmp_path / "q8.gguf")
    src, dst = gguf.GGUFReader(str(q4_file)), gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in dst.tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["output_norm.weight"] == "F32"
    assert dst.fields["llama.block_count"].contents() == src.fields["llama.block_count"].contents()
    assert dst.fields["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_Q8_0)
    assert (dst.fields["tokenizer.ggml.tokens"].contents()
            == src.fields["tokenizer.ggml.tokens"].contents())


def test_one_tiny_run_counts_fewer_bytes_for_packed_weights(
        q4_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "r.json"
    quantized.main(["--model", str(q4_file), "--repeats", "1", "--prompt", "4", "--tokens", "3",
                    "--out", str(out)])
    results = json.loads(out.read_text())["results"]["default"]
    dense, q4, q8 = (results[k]["bytes_per_token"] for k in (
        "float32 (dequantized)", "packed (the file's types)", "packed Q8_0 (re-quantized)"))
    # Linear weights and one embedding row: float32 4 bytes a weight, Q8_0 34/32, Q4_1 20/32
    # (the norms stay float32 in all three).
    config = {"hidden": 64, "inter": 128, "vocab": 512, "layers": 2, "q": 64, "kv": 32}

    def weights(rows: int, cols: int, padded: bool = False) -> int:
        """rows x cols, the rows padded to whole panels where float32 panels are the copy."""
        width = cpu_linear_panels.width() if padded and cpu_linear_panels.chosen() else 1
        return -(-rows // width) * width * cols

    def linears(padded: bool) -> int:
        return config["layers"] * (
            weights(config["q"] + 2 * config["kv"], 64, padded) + weights(64, config["q"], padded)
            + weights(2 * config["inter"], 64, padded) + weights(64, config["inter"], padded)
        ) + weights(512, 64, padded)

    linear = linears(False)
    norms, row = 4 * 64 * (2 * config["layers"] + 1), 64
    assert dense == 4 * (linears(True) + row) + norms
    assert q8 == (linear + row) * 34 // 32 + norms
    assert q4 == (linear + row) * 20 // 32 + norms
    assert "bs=1 decode tok/s" in capsys.readouterr().out


def test_llama_cpp_runs_on_the_same_packed_files_with_each_thread_count(
        q4_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # A stand-in llama-bench that records its arguments and answers as llama-bench -o json does.
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    fake = bin_dir / "llama-bench"
    fake.write_text("#!/bin/sh\n"
                    f'echo "$@" >> {calls}\n'
                    "echo '[{\"n_prompt\": 0, \"n_gen\": 3, \"avg_ts\": 50.0, "
                    "\"samples_ts\": [50.0]}]'\n")
    fake.chmod(0o755)
    out = tmp_path / "r.json"
    quantized.main(["--model", str(q4_file), "--repeats", "2", "--prompt", "4", "--tokens", "3",
                    "--threads", "1", "2", "--no-q8", "--llama-cpp", str(bin_dir),
                    "--out", str(out)])
    lines = calls.read_text().splitlines()
    # The packed file once after each of Strand's timed requests (2 a thread count), never the
    # float32 row; decoding after the prompt's 4 tokens of context, as Strand's rows do.
    assert len(lines) == 4
    assert all(f"-m {q4_file} -p 0 -n 3 -d 4 -r 1" in line for line in lines)
    assert [line.split()[-1] for line in lines] == ["1", "1", "2", "2"]
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"1", "2"}
    packed = results["1"]["packed (the file's types)"]
    assert packed["llama_cpp_tok_s"] == [50.0, 50.0]  # one run (-r 1) a turn
    assert packed["turn_ratios"] == [rate / 50.0 for rate in packed["runs"]]
    # The weights and the KV cache at the mean context, 4 + 3 / 2 tokens: K and V of 2 layers
    # of 32 float32 values each (the tiny model's 2 kv heads of 16).
    assert packed["kv_bytes_per_token"] == round(2 * 2 * 32 * 4 * 5.5)
    assert packed["bound_tok_s"] == packed["bandwidth_bytes_s"] / (
        packed["bytes_per_token"] + packed["kv_bytes_per_token"])
    assert "turn by turn" in capsys.readouterr().out


def test_llama_cpp_directory_without_llama_bench_is_refused(q4_file: Path,
                                                            tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        quantized.main(["--model", str(q4_file), "--llama-cpp", str(tmp_path)])


def test_kv_cache_dtype_reaches_strands_engine(q4_file: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from strand.engine_core import LLMEngine

    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    seen: list[str] = []
    original = LLMEngine.from_engine_args.__func__  # type: ignore[attr-defined]

    def spy(cls: type, engine_args: object, *args: object, **kwargs: object) -> object:
        seen.append(engine_args.kv_cache_dtype)  # type: ignore[attr-defined]
        return original(cls, engine_args, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "from_engine_args", classmethod(spy))
    out = tmp_path / "r.json"
    quantized.main(["--model", str(q4_file), "--repeats", "1", "--prompt", "4", "--tokens", "3",
                    "--no-q8", "--no-float32", "--kv-cache-dtype", "bfloat16", "--out", str(out)])
    assert seen == ["bfloat16"]
    assert json.loads(out.read_text())["kv_cache_dtype"] == "bfloat16"


def test_turn_ratios_pair_each_request_with_the_peers_run_after_it() -> None:
    assert quantized.turn_ratios([30.0, 40.0], [20.0, 50.0]) == [1.5, 0.8]
    assert quantized.turn_ratios([30.0, 40.0], [20.0]) == []
    assert quantized.turn_ratios([30.0], []) == []


def test_the_decode_clock_starts_at_the_first_token_not_the_first_step() -> None:
    # A 3,000-token prompt under a 2,048-token step budget: the first step gives no token.
    marks = [(10.0, 1.0, 0), (14.0, 5.0, 1), (14.5, 5.5, 2), (15.0, 6.0, 3)]
    rate, cpu_ms = quantized.decode_rate(marks)
    assert rate == 2 / 1.0 and cpu_ms == 1e3 * 1.0 / 2
    with pytest.raises(ValueError, match="at least 2 tokens"):
        quantized.decode_rate([(1.0, 1.0, 0), (2.0, 2.0, 1)])


def test_a_prompt_longer_than_a_steps_token_budget_is_timed_from_its_first_token(
        q4_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from strand.engine_core import LLMEngine

    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    original = LLMEngine.from_engine_args.__func__  # type: ignore[attr-defined]

    def small_budget(cls: type, engine_args: object, *args: object, **kwargs: object) -> object:
        engine_args.max_num_batched_tokens = 64  # type: ignore[attr-defined]
        return original(cls, engine_args, *args, **kwargs)

    seen: list[list[tuple[float, float, int]]] = []
    rate = quantized.decode_rate

    def recording(marks: list[tuple[float, float, int]]) -> tuple[float, float]:
        seen.append(list(marks))
        return rate(marks)

    monkeypatch.setattr(LLMEngine, "from_engine_args", classmethod(small_budget))
    monkeypatch.setattr(quantized, "decode_rate", recording)
    quantized.main(["--model", str(q4_file), "--repeats", "1", "--prompt", "100", "--tokens",
                    "3", "--no-q8", "--no-float32", "--out", str(tmp_path / "r.json")])
    # The timed request's 100-token prompt took two steps of at most 64 tokens (the second
    # gave the first token), then one step a token: the clock started at the second.
    assert [tokens for _, _, tokens in seen[0]] == [0, 1, 2, 3]


def test_one_token_has_no_decode_rate_and_is_refused(
        q4_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        quantized.main(["--model", str(q4_file), "--tokens", "1"])
    assert "--tokens must be >= 2" in capsys.readouterr().err
