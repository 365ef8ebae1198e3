"""The served_peers benchmark's helpers: prompts, arrivals, stream parsing, statistics, commands
and flags (no servers are started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import served_peers as sp
from benchmarks.llama_server import llama_server_cmd


def test_prompts_are_the_same_for_a_seed_and_clear_of_special_ids() -> None:
    a = sp.make_prompts(3, 4, 16, vocab_size=49152)
    assert a == sp.make_prompts(3, 4, 16, vocab_size=49152)
    assert a != sp.make_prompts(4, 4, 16, vocab_size=49152)
    assert len(a) == 4 and all(len(p) == 16 for p in a)
    assert all(sp.FIRST_ID <= t < sp.LAST_ID for p in a for t in p)
    small = sp.make_prompts(0, 2, 64, vocab_size=1200)
    assert all(t < 1200 for p in small for t in p)
    with pytest.raises(ValueError, match="vocab_size"):
        sp.make_prompts(0, 1, 1, vocab_size=sp.FIRST_ID)


def test_poisson_offsets_start_at_zero_rise_and_match_the_rate() -> None:
    offsets = sp.poisson_offsets(4.0, 2000, seed=1)
    assert offsets[0] == 0.0
    assert all(b >= a for a, b in zip(offsets, offsets[1:], strict=False))
    assert offsets == sp.poisson_offsets(4.0, 2000, seed=1)
    assert 1999 / offsets[-1] == pytest.approx(4.0, rel=0.1)
    assert sp.poisson_offsets(0.0, 3, seed=1) == [0.0, 0.0, 0.0]


def _event(text: str | None = None, usage: tuple[int, int] | None = None) -> bytes:
    event: dict[str, object] = {"choices": [] if text is None else [{"text": text, "index": 0}]}
    if usage is not None:
        event["usage"] = {"completion_tokens": usage[0], "prompt_tokens": usage[1]}
    return b"data: " + json.dumps(event).encode() + b"\n"


def test_a_stream_gives_ttft_gaps_and_usage() -> None:
    # llama-server's shape: text events, an empty-text last one with the usage, then [DONE].
    lines = [b": keep-alive\n", _event("a"), b"\n", _event(""), _event("b"), _event("c"),
             _event("", usage=(3, 7)), b"data: [DONE]\n"]
    ticks = iter([1.5, 2.0, 2.25, 3.0, 3.5])
    request = sp.Request()
    sp.read_stream(lines, request, sent=1.0, clock=lambda: next(ticks))
    assert request.ttft_s == pytest.approx(0.5)
    assert request.gaps_s == pytest.approx([0.75, 0.75])  # the empty text is no event
    assert (request.num_tokens, request.num_prompt_tokens, request.error) == (3, 7, None)


def _request(sent: float, ttft: float, done: float, gaps: list[float], tokens: int,
             error: str | None = None) -> sp.Request:
    return sp.Request(sent_s=sent, ttft_s=ttft, done_s=done, gaps_s=gaps, num_tokens=tokens,
                      num_prompt_tokens=8, error=error)


def test_summarize_counts_only_complete_requests_over_the_whole_wall_time() -> None:
    requests = [_request(0.0, 0.1, 2.0, [0.1, 0.3], 4), _request(1.0, 0.3, 4.0, [0.2], 4),
                _request(0.5, 0.2, 1.0, [], 2), _request(0.5, 0.0, 0.6, [], 0, error="HTTP 500")]
    s = sp.summarize(requests, output_tokens=4)
    assert (s["num_requests"], s["num_ok"], s["num_failed"]) == (4, 2, 2)
    assert s["errors"] == ["2 tokens", "HTTP 500"]
    assert s["elapsed_s"] == pytest.approx(4.0)
    assert s["output_tok_s"] == pytest.approx(8 / 4.0)
    assert s["requests_per_s"] == pytest.approx(2 / 4.0)
    assert s["ttft_p50_ms"] == pytest.approx(200.0)
    assert s["ttft_p99_ms"] == pytest.approx(100 + 200 * 0.99)
    assert s["itl_p50_ms"] == pytest.approx(200.0)
    assert s["prompt_tokens"] == 8


def test_summarize_of_nothing_is_zeros() -> None:
    s = sp.summarize([], output_tokens=4)
    assert s["output_tok_s"] == 0.0 and s["ttft_p99_ms"] == 0.0 and s["num_requests"] == 0


def test_medians_over_rounds_and_ratios() -> None:
    base = {"num_requests": 4, "num_failed": 0, "prompt_tokens": 8, "requests_per_s": 1.0,
            "ttft_p50_ms": 1.0, "itl_p50_ms": 1.0, "itl_p99_ms": 1.0}
    rounds = [{**base, "output_tok_s": v, "ttft_p99_ms": t, "num_failed": f}
              for v, t, f in ((100.0, 900.0, 0), (300.0, 500.0, 1), (200.0, 700.0, 0))]
    m = sp.median_over_rounds(rounds)
    assert (m["output_tok_s"], m["ttft_p99_ms"], m["num_failed"], m["num_requests"]) == \
        (200.0, 700.0, 1, 12)
    llama = {**m, "output_tok_s": 100.0, "ttft_p99_ms": 1000.0}
    assert sp.ratios(m, llama) == pytest.approx({"throughput": 2.0, "ttft_p99": 0.7})
    assert sp.ratios(m, {**llama, "output_tok_s": 0.0})["throughput"] is None


def test_the_table_has_a_row_per_workload_and_server_and_ratios_on_strand_rows() -> None:
    figures = {"num_requests": 4, "num_failed": 1, "prompt_tokens": 8, "output_tok_s": 10.0,
               "requests_per_s": 1.0, "ttft_p50_ms": 5.0, "ttft_p99_ms": 9.0,
               "itl_p50_ms": 1.0, "itl_p99_ms": 2.0}
    data = {"workloads": {name: {"median": {"llama-server": figures, "strand": figures},
                                 "ratios": {"throughput": 1.5, "ttft_p99": 0.5}}
                          for name in sp.workload_names(4, [1.0, 2.5])}}
    lines = sp.summary_table(data).splitlines()
    assert len(lines) == 2 + 6
    assert lines[2].startswith("burst 4") and "3/4" in lines[2] and "1.50x" not in lines[2]
    assert lines[3].split()[2] == "strand" and lines[3].split()[-2:] == ["1.50x", "0.50x"]
    assert lines[-1].startswith("rate 2.5/s")


def test_workload_names() -> None:
    assert sp.workload_names(32, [1.0, 2.0]) == ["burst 32", "rate 1/s", "rate 2/s"]
    assert sp.workload_names(0, [0.5]) == ["rate 0.5/s"]


def test_cpu_model_is_the_first_model_name() -> None:
    cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nprocessor\t: 1\nmodel name\t: x\n"
    assert sp.cpu_model(cpuinfo) == "AMD EPYC 9R14"
    assert sp.cpu_model("") == "unknown"
    flags = "flags\t\t: fpu sse avx2 avx512f avx512_bf16\nflags\t\t: amx_tile\n"
    assert sp.cpu_isa(flags) == ["avx2", "avx512f", "avx512_bf16"]
    assert sp.cpu_isa("") == []


def test_both_servers_get_the_same_slots_threads_and_context() -> None:
    ctx = sp.ctx_per_slot(128, 128)
    assert ctx == 128 + 128 + sp.CTX_MARGIN
    cmd = llama_server_cmd(Path("/bin"), Path("m.gguf"), 8080, slots=32, threads=2, ctx=ctx)
    assert cmd[0] == "/bin/llama-server"
    pairs = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert (pairs["-m"], pairs["-np"], pairs["-c"], pairs["-t"], pairs["-tb"], pairs["--port"]) \
        == ("m.gguf", "32", str(32 * ctx), "2", "2", "8080")
    flags = sp.strand_engine_flags("float32", "none", slots=32, threads=2, ctx=ctx,
                                   kv_bytes_per_token=100)
    values = dict(zip(flags[::2], flags[1::2], strict=True))
    assert (values["--max-num-seqs"], values["--cpu-threads"], values["--max-model-len"]) == \
        ("32", "2", str(ctx))
    assert int(values["--kv-cache-memory"]) >= 32 * ctx * 100
    assert "--quantization" not in values
    assert sp.strand_engine_flags("float32", "gguf", 1, 1, 8, 1)[-2:] == ["--quantization", "gguf"]


def test_kv_bytes_per_token() -> None:
    config = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
              "num_hidden_layers": 30}
    assert sp.kv_bytes_per_token(config, "float32") == 2 * 30 * 3 * 64 * 4
    assert sp.kv_bytes_per_token({**config, "head_dim": 32}, "bfloat16") == 2 * 30 * 3 * 32 * 2


def test_the_completion_body_streams_greedy_token_ids_with_usage() -> None:
    body = json.loads(sp.completion_body("m", [5, 6], 3))
    assert body == {"model": "m", "prompt": [5, 6], "max_tokens": 3, "ignore_eos": True,
                    "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("flags, message", [
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--slots", "0"], "--slots must be >= 1"),
    (["--rates", "0"], "every --rates > 0"),
    (["--burst", "0", "--rates"], "nothing to run"),
    (["--backends", "strand", "--gguf", "/nonexistent.gguf"], "is not a file"),
])
def test_bad_flags_are_one_line_errors(flags: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    argv = flags if "--gguf" in flags else ["--gguf", "/nonexistent.gguf", *flags]
    with pytest.raises(SystemExit) as exit_info:
        sp.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_llama_server_must_be_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(SystemExit):
        sp.main(["--gguf", str(gguf), "--llama-cpp", str(tmp_path)])
    assert "llama-server" in capsys.readouterr().err
