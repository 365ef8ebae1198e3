"""Measuring a narrower CPU on a wider one: the AVX2 figures of an AVX2-only CPU on an AVX-512 one.

Every backend of benchmarks/cpu_peers.py is restricted to the same instruction set:
  Strand's C++ kernels   STRAND_CPU_ISA (strand/platform/cpu_isa.py builds them with -march=x86-64-v3)
  torch's own kernels    ATEN_CPU_CAPABILITY (ATen's vectorised CPU kernels: its dispatch level)
  oneDNN                 ONEDNN_MAX_CPU_ISA (the engine's linear layers, strand/kernels/cpu_linear.py)
  MKL                    MKL_ENABLE_INSTRUCTIONS (torch.matmul, HF transformers' linear layers)
  llama.cpp              a build without any AVX-512/AMX/AVX-VNNI option (cpu_peers_setup --isa
                         avx2), checked here to hold no instruction that names a zmm register.
Each variable is read by its library once, at first use, so it is set in the environment of the
process before it starts. What stays the wider machine's: caches, memory bandwidth, clock; the
instruction set is what an AVX2-only CPU (x86-64-v3) runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from strand.platform.cpu_isa import ENV as STRAND_ISA_ENV
from strand.platform.cpu_isa import torch_isa_env

# "native": whatever this CPU has, nothing set.
ISAS = ("native", "avx2")


def isa_env(isa: str) -> dict[str, str]:
    """The environment that restricts Strand, torch, oneDNN and MKL to `isa`."""
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {', '.join(ISAS)}, got {isa!r}")
    if isa == "native":
        return {}
    return {STRAND_ISA_ENV: isa, **torch_isa_env(isa)}


def run_capped(isa: str, module: str, argv: list[str] | None) -> None:
    """Runs `python -m module argv` again in this process's place with the caps of `isa` set,
    unless they are already: the libraries read their caps once, when they load."""
    caps = isa_env(isa)
    if any(os.environ.get(k) != v for k, v in caps.items()):
        os.execve(sys.executable, [sys.executable, "-m", module,
                                   *(sys.argv[1:] if argv is None else argv)],
                  {**os.environ, **caps})


def zmm_users(bin_dir: Path) -> dict[str, int]:
    """File name -> how often its code names a zmm register (AVX-512), for every executable and
    shared library in bin_dir that does (objdump -d over each)."""
    found: dict[str, int] = {}
    for path in sorted(bin_dir.iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        if ".so" not in path.name and not os.access(path, os.X_OK):
            continue
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)],
                              capture_output=True, text=True, check=True).stdout
        count = text.count("%zmm")
        if count:
            found[path.name] = count
    return found


def check_llama_cpp(bin_dir: Path, isa: str) -> None:
    """Refuse a llama.cpp build wider than `isa`: its figures would be the wider CPU's."""
    if isa == "native":
        return
    wide = zmm_users(bin_dir)
    if wide:
        raise ValueError(f"--llama-cpp {bin_dir} holds AVX-512 (zmm) instructions {wide}: build "
                         f"it for {isa} with `python -m benchmarks.cpu_peers_setup --isa {isa}`")


def observed() -> dict[str, Any]:
    """What this process actually runs: ATen's dispatch level, Strand's kernel level, and the
    variables in force (recorded with every result, so a run says what it measured)."""
    import torch

    from strand.platform import cpu_isa

    return {"aten": torch.backends.cpu.get_cpu_capability(), "strand": cpu_isa.probe().level,
            "env": {name: os.environ.get(name, "") for name in
                    (STRAND_ISA_ENV, *torch_isa_env("avx2"))}}
