"""Arize Phoenix as a real OTLP trace backend for e2e tests: its own process from its own venv
(scripts/phoenix_setup.sh), bound to 127.0.0.1 on free ports, its database in a temp dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strand.services.launch import REPO_ROOT, free_port

# PHOENIX_BIN overrides where the `phoenix` command is looked for.
DEFAULT_PHOENIX_BIN = REPO_ROOT / ".venv-phoenix" / "bin" / "phoenix"


def phoenix_bin() -> Path | None:
    path = Path(os.environ.get("PHOENIX_BIN", DEFAULT_PHOENIX_BIN))
    return path if path.is_file() and os.access(path, os.X_OK) else None


@dataclass(slots=True)
class PhoenixServer:
    executable: Path
    working_dir: Path
    http_port: int = 0
    grpc_port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def otlp_endpoint(self) -> str:
        """Where `--otlp-traces-endpoint` points: Phoenix's OTLP/gRPC receiver."""
        return f"http://127.0.0.1:{self.grpc_port}"

    def start(self) -> PhoenixServer:
        """Start the process and return at once (wait_ready() waits): its start-up takes long
        enough (migrations, the UI bundle) that the caller does other work meanwhile."""
        self.http_port, self.grpc_port = free_port(), free_port()
        env = {**os.environ, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(self.http_port),
               "PHOENIX_GRPC_PORT": str(self.grpc_port),
               "PHOENIX_WORKING_DIR": str(self.working_dir),
               "PHOENIX_TELEMETRY_ENABLED": "false"}
        log = open(self.working_dir / "phoenix.log", "ab")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen([str(self.executable), "serve"], env=env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"phoenix exited ({self.process.returncode}): {self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"phoenix not healthy after {timeout:.0f}s: {self.log()}")

    def log(self) -> str:
        path = self.working_dir / "phoenix.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def get(self, path: str, **query: str | list[str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(query, doseq=True)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)

    def spans(self, project: str, **query: str | list[str]) -> list[dict[str, Any]]:
        """Phoenix's REST span search (GET /v1/projects/{project}/spans), one page of 1000."""
        body = self.get(f"/v1/projects/{urllib.parse.quote(project)}/spans", limit="1000",
                        **query)
        return list(body["data"])

    def wait_for_spans(self, project: str, trace_id: str, names: set[str],
                       timeout: float = 30.0) -> list[dict[str, Any]]:
        """The trace's spans once every name in `names` is among them (the stages export in
        batches every half second and Phoenix inserts in batches too)."""
        deadline = time.monotonic() + timeout
        spans: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                spans = self.spans(project, trace_id=trace_id)
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # 404: the project appears with its first span
                    raise
            if names <= {s["name"] for s in spans}:
                return spans
            time.sleep(0.3)
        raise AssertionError(f"trace {trace_id} in {project!r} has only "
                             f"{sorted(s['name'] for s in spans)} after {timeout:.0f}s")


def chromium_bin() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(url: str, *mode: str, window: tuple[int, int] = (1600, 1000)) -> bytes:
    """Run headless Chromium on `url` with `mode` (--screenshot=... or --dump-dom); stdout.
    Phoenix is a JS app: the virtual time budget lets its queries and rendering finish."""
    executable = chromium_bin()
    assert executable is not None
    command = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--disable-background-networking", "--disable-component-update",
               "--no-first-run", f"--window-size={window[0]},{window[1]}",
               "--virtual-time-budget=15000", *mode, url]
    done = subprocess.run(command, capture_output=True, timeout=60, check=True)
    return done.stdout
