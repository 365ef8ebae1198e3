"""Wait for the front's /health (the launcher's counterpart of wait_healthy for gRPC)."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request


def wait_http_healthy(url: str, timeout: float,
                      process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"openai front exited with code {process.returncode} before "
                               f"it was healthy")
        try:
            with urllib.request.urlopen(url, timeout=2.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"openai front at {url} not healthy after {timeout:.0f}s")
        time.sleep(0.2)
