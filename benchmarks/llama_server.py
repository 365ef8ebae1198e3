"""llama.cpp's llama-server as a benchmark peer: started on a GGUF file, waited for until its
/health says ok, stopped. Used by benchmarks/served_peers.py (the same OpenAI load on it and on
Strand) and benchmarks/memory.py (its load time and RSS)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.common import log
from benchmarks.strand_backends import bench_log_dir


def llama_server_cmd(bin_dir: Path, gguf: Path, port: int, slots: int, threads: int,
                     ctx: int) -> list[str]:
    """-np slots with ctx tokens each (continuous batching is its default), threads for decode
    and batches alike, on 127.0.0.1."""
    return [str(bin_dir / "llama-server"), "-m", str(gguf), "-np", str(slots),
            "-c", str(slots * ctx), "-t", str(threads), "-tb", str(threads),
            "--host", "127.0.0.1", "--port", str(port)]


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class LlamaServer:
    """A running llama-server; `load_s`: from its start to /health answering ok."""

    def __init__(self, bin_dir: Path, gguf: Path, slots: int, threads: int, ctx: int,
                 start_timeout: float = 600.0) -> None:
        from strand.platform.ports import free_ports

        [port] = free_ports("127.0.0.1", 1)
        self.address = f"127.0.0.1:{port}"
        log_path = bench_log_dir() / "llama-server.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = llama_server_cmd(bin_dir, gguf, port, slots, threads, ctx)
        log("  $ " + " ".join(cmd))
        started = time.perf_counter()
        with open(log_path, "wb") as out:
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + start_timeout
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {self.process.returncode} "
                                       f"(see {log_path})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server not healthy in {start_timeout} s")
                try:
                    if get_json(f"http://{self.address}/health").get("status") == "ok":
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.05)
            self.load_s = time.perf_counter() - started
            self.model = get_json(f"http://{self.address}/v1/models")["data"][0]["id"]
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
