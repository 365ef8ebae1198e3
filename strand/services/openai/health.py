"""Wait for the front's /health (the launcher's counterpart of wait_healthy for gRPC)."""

from __future__ import annotations

import subprocess
import sys
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


def main(argv: list[str] | None = None) -> int:
    """`python -m strand.services.openai.health URL`: 0 when URL answers 200 now (a container's
    healthcheck), 1 with a one-line reason otherwise."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m strand.services.openai.health URL", file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(args[0], timeout=4.0) as resp:
            if resp.status == 200:
                return 0
            print(f"{args[0]}: HTTP {resp.status}", file=sys.stderr)
    except (urllib.error.URLError, OSError) as exc:
        print(f"{args[0]}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
