"""`smg launch` (the Shepherd Model Gateway, PyPI `smg`) in front of VllmEngine workers, for the
tests and the benchmark that put Strand stacks behind it."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from strand.platform.ports import free_ports

READY_TIMEOUT_S = 120.0


class SmgError(RuntimeError):
    """smg is missing, exited, or did not see its workers in time (the message says which)."""


def smg_binary() -> str:
    smg = shutil.which("smg")
    if smg is None:
        raise SmgError("smg is not installed (pip install smg)")
    return smg


@contextlib.contextmanager
def launch_smg(worker_urls: list[str], log_path: Path, policy: str = "round_robin"
               ) -> Iterator[str]:
    """smg routing to `worker_urls` (grpc://HOST:PORT), yielded as its base URL once it lists
    the model and every worker is healthy; stopped on exit."""
    smg = smg_binary()
    port, metrics_port = free_ports("127.0.0.1", 2)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [smg, "launch", "--worker-urls", *worker_urls, "--host", "127.0.0.1",
             "--port", str(port), "--policy", policy, "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(metrics_port)],  # not 29000: smg fronts run side by side
            stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for_workers(base, len(worker_urls), process, log_path)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def _num_healthy(workers: Any) -> int:
    return sum(1 for worker in workers.get("workers", []) if worker.get("is_healthy"))


def _wait_for_workers(base: str, num_workers: int, process: subprocess.Popen[bytes],
                      log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SmgError(f"smg exited: {log.read_text()[-2000:]}")
        try:
            body = urllib.request.urlopen(f"{base}/v1/models", timeout=2).read()
            workers = json.loads(urllib.request.urlopen(f"{base}/workers", timeout=2).read())
            if b'"data":[]' not in body and _num_healthy(workers) >= num_workers:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    raise SmgError(f"smg had not {num_workers} worker(s) with the model within "
                   f"{READY_TIMEOUT_S:.0f} s: {log.read_text()[-2000:]}")
