"""The ring-overhead benchmark: a run on the tiny model reports every part."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from benchmarks import ring_overhead
from tests.benchmarks.conftest import TINY_WORKLOAD, model_flags


def test_a_run_reports_ttft_cpu_and_alternating_throughput_pairs(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ring.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        ring_overhead.main([*model_flags(tiny_model_dir), *TINY_WORKLOAD, "--num-ttft", "3",
                            "--throughput-repeats", "2", "--hop-messages", "5",
                            "--output-json", str(out)])
    data = json.loads(out.read_text())
    assert data["ttft_ms"]["ring_p50"] > 0 and data["ttft_ms"]["in_process_p50"] > 0
    # Lone requests after the floor's idle gap, and the tail beside the median.
    assert data["ttft_gap_ms"] == 20.0
    assert data["ttft_ms"]["ring_p90"] >= data["ttft_ms"]["ring_p50"]
    assert data["ttft_ms"]["in_process_p90"] >= data["ttft_ms"]["in_process_p50"]
    assert "TTFT p50 ms, after 20 ms idle" in stdout.getvalue()
    assert "TTFT p90 ms: " in stdout.getvalue()
    hop = data["grpc_hop_ms"]
    # The stack's stages are on this host, so they link: the floor counts four link hops.
    assert data["stage_transport"] == "link"
    assert data["ttft_ms"]["floor"] == pytest.approx(
        hop["grpc_new_call_ms"] + ring_overhead.STAGE_HOPS * hop["link_after_gap_ms"])
    assert "floor (a bare gRPC call + 4 link hops)" in stdout.getvalue()
    assert hop["grpc_busy_ms"] > 0 and hop["socket_after_gap_ms"] > 0
    assert set(data["cpu_s_per_1000_tokens"]) == {"tokenizer", "engine", "detokenizer",
                                                  "gateway", "client (this benchmark)"}
    assert set(data["cpu_ms_per_lone_request"]) == set(data["cpu_s_per_1000_tokens"])
    assert data["cpu_ms_per_lone_request"]["gateway"] > 0  # every lone request passes it
    assert "CPU ms / lone request" in stdout.getvalue()
    pairs = data["throughput"]
    assert len(pairs["ratios"]) == 2
    assert pairs["first"] == ["in process", "ring"]  # the order alternates against drift
    assert pairs["ratios"] == [b / a for a, b in zip(pairs["in_process_tok_s"],
                                                     pairs["ring_tok_s"], strict=True)]
    assert "median" in stdout.getvalue()
    # Where each run's CPU went: every process of the ring's run, the client too, and the sum
    # outside the engine; each run took the wall time its rate says.
    for cpu, others in zip(pairs["ring_cpu_s"], pairs["others_cpu_s"], strict=True):
        assert set(cpu) == {"tokenizer", "engine", "detokenizer", "gateway", "client"}
        assert cpu["engine"] > 0 and cpu["client"] >= 0
        assert others == pytest.approx(sum(v for k, v in cpu.items() if k != "engine"))
    assert all(cpu > 0 for cpu in pairs["in_process_cpu_s"])
    for rates, times in (("in_process_tok_s", "in_process_s"), ("ring_tok_s", "ring_s")):
        tokens = [r * t for r, t in zip(pairs[rates], pairs[times], strict=True)]
        assert tokens == pytest.approx([data["workload"]["output_tokens"]] * 2)
    assert all(w >= 0 for w in pairs["in_process_engine_wait_s"] + pairs["ring_engine_wait_s"])
    assert "CPU s outside the engine (ring)" in stdout.getvalue()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs 2 CPUs")
def test_a_pinned_run_puts_the_engine_on_its_cpus_and_gives_this_process_its_own_back(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch

    own_cpus, own_threads = os.sched_getaffinity(0), torch.get_num_threads()
    engine_cpu = min(own_cpus)
    out = tmp_path / "ring.json"
    with contextlib.redirect_stdout(io.StringIO()):
        ring_overhead.main([*model_flags(tiny_model_dir), *TINY_WORKLOAD, "--num-ttft", "2",
                            "--throughput-repeats", "1", "--engine-cpus", str(engine_cpu),
                            "--hop-messages", "0",
                            "--output-json", str(out)])
    data = json.loads(out.read_text())
    assert data["engine_cpus"] == [engine_cpu] and data["num_threads"] == 1
    assert len(data["throughput"]["ratios"]) == 1
    assert os.sched_getaffinity(0) == own_cpus and torch.get_num_threads() == own_threads


def test_the_engine_cpus_flag_names_a_bad_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ring_overhead.main(["--engine-cpus", "1-0"])
    assert exc.value.code == 2
    assert "--engine-cpus: range '1-0' runs backwards" in capsys.readouterr().err


def test_the_hop_floor_refuses_bad_counts_by_name() -> None:
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
        ring_overhead.main(["--hop-messages", "-1"])
    assert "--hop-messages must be >= 0" in err.getvalue()


def test_a_bare_hop_is_timed_between_two_processes() -> None:
    from benchmarks.grpc_hop import measure_hops

    hops = measure_hops(count=5, gap_ms=1.0)
    # Stamps of two processes on one monotonic clock: a message is seen after it is sent.
    assert 0 < hops["grpc_busy_ms"] < 1000 and 0 < hops["grpc_after_gap_ms"] < 1000
    assert 0 < hops["socket_after_gap_ms"] < 1000 and 0 < hops["link_after_gap_ms"] < 1000
    # Round trips are timed too. Not compared with the one-way hop: five samples on a shared
    # 2-core machine put a one-way median above a round trip once in CI. Their order is the
    # benchmark's to report, not a test's to assert.
    assert 0 < hops["grpc_new_call_ms"] < 1000 and 0 < hops["grpc_stream_round_trip_ms"] < 1000
    assert 0 < hops["grpc_unix_busy_ms"] < 1000 and 0 < hops["grpc_unix_after_gap_ms"] < 1000
    with pytest.raises(ValueError, match="count must be >= 1"):
        measure_hops(count=0)


def test_the_idle_gap_refuses_a_bad_value_by_name() -> None:
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
        ring_overhead.main(["--ttft-gap-ms", "-5"])
    assert "--ttft-gap-ms must be in [0, 10000], got -5" in err.getvalue()
