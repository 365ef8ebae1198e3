"""Every kernel compiles for a real GPU (sm_90 cubin) even here, where none is present.

The interpreter runs kernels as Python and accepts things the compiler rejects (a loop-carried
value changing type, a dot shape under 16, an unsupported dot precision). Compiling ahead of
time with Triton's bundled ptxas catches those on a CPU-only machine. The compiler runs in a
child process: this one imported Triton in interpreter mode.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.gpu_compile_check import variants

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton.backends.nvidia") is None,
    reason="Triton's NVIDIA backend (with its ptxas) is not installed")


@pytest.fixture(scope="module")
def compile_results() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kernels.gpu_compile_check"], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=600)  # minutes on a loaded 2-core machine
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


@pytest.mark.parametrize("variant", sorted(variants()))
def test_kernel_compiles_for_sm90(variant: str, compile_results: dict[str, str]) -> None:
    assert compile_results[variant] == "ok"
