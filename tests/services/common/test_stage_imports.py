"""The tokenizer and detokenizer stages start without loading torch (about 200 MB of RSS each
for nothing: they need the model's limits and its tokenizer, not its weights)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Runs a stage's main with an import hook that exits 3 the moment torch is imported, and exits
# 0 once the stage says it listens.
_PROBE = """
import os, sys, threading, runpy
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("torch imported", flush=True)
            os._exit(3)
sys.meta_path.insert(0, NoTorch())
real_print = print
def watching_print(*args, **kwargs):
    real_print(*args, **kwargs)
    if args and "listening on" in str(args[0]):
        os._exit(0)
import builtins
builtins.print = watching_print
threading.Timer(60, lambda: os._exit(4)).start()
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("stage", ["strand.services.tokenizer", "strand.services.detokenizer"])
def test_stage_starts_without_torch(stage: str, tiny_model_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _PROBE, stage, "--model", str(tiny_model_dir),
                           "--port", "0"], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
