"""What this CPU can run, probed once, with an override that makes a wider CPU behave narrower.

Every CPU-specific path is chosen from here: the C++ kernels' build flags (strand/kernels/_cpu_build.py),
whether oneDNN takes bfloat16 linear layers (strand/kernels/cpu_linear.py: its bfloat16 path needs
AVX-512 BW/VL/DQ or AVX-NE-CONVERT, and raises on an AVX2-only CPU), and the log line that says
what was chosen.

STRAND_CPU_ISA=avx2 (or `generic`) caps the level: the kernels are built for it, oneDNN is capped
with ONEDNN_MAX_CPU_ISA, torch's own kernels with ATEN_CPU_CAPABILITY and MKL (torch's matmul)
with MKL_ENABLE_INSTRUCTIONS (each read once, on first use, so `apply_override()` runs when
`kernels` is imported), and bfloat16 takes the paths an
AVX2-only CPU takes. CI runs the kernel and model-runner tests a second time under it, so a
machine with AVX-512 cannot hide a path that breaks without it. A level above what the CPU has is
an error: code built for it would die on an illegal instruction.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from strand import envs

logger = logging.getLogger(__name__)

ENV = "STRAND_CPU_ISA"
# Narrowest first. x86-64 only: elsewhere (aarch64) the level is "native".
LEVELS = ("generic", "avx2", "avx512")
_LEVEL_FLAGS = {  # what each level needs from /proc/cpuinfo
    "avx2": {"avx", "avx2", "fma", "f16c", "bmi2"},
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"},
}
_MARCH = {"generic": "-march=x86-64-v2", "avx2": "-march=x86-64-v3", "avx512": "-march=x86-64-v4"}
# What torch and oneDNN call the same caps.
_ATEN_CAPABILITY = {"generic": "default", "avx2": "avx2", "avx512": "avx512"}
_ONEDNN_ISA = {"generic": "SSE41", "avx2": "AVX2", "avx512": "AVX512_CORE"}
_MKL_ISA = {"generic": "SSE4_2", "avx2": "AVX2", "avx512": "AVX512"}


def torch_isa_env(level: str) -> dict[str, str]:
    """The variables that cap torch's CPU libraries (ATen, oneDNN, MKL) at `level`."""
    return {"ONEDNN_MAX_CPU_ISA": _ONEDNN_ISA[level], "ATEN_CPU_CAPABILITY": _ATEN_CAPABILITY[level],
            "MKL_ENABLE_INSTRUCTIONS": _MKL_ISA[level]}


@dataclass(frozen=True, slots=True)
class CpuIsa:
    machine: str  # platform.machine(): x86_64, aarch64, ...
    detected: str  # the widest level the CPU has: one of LEVELS, or "native" off x86
    level: str  # the level every path is chosen for: detected, or lower under STRAND_CPU_ISA
    flags: frozenset[str]  # the CPU's feature flags (empty where they could not be read)
    vendor: str = ""  # /proc/cpuinfo's vendor_id: GenuineIntel, AuthenticAMD ("" if unread)

    @property
    def overridden(self) -> bool:
        return self.level != self.detected

    @property
    def onednn_bf16(self) -> bool:
        """oneDNN's bfloat16 inner product (and its weight reorder) runs on AVX-512 BW/VL/DQ or
        AVX-NE-CONVERT only; elsewhere torch's op raises instead of falling back."""
        if self.level == "avx512":
            return True
        return self.level == self.detected and "avx_ne_convert" in self.flags

    @property
    def vnni(self) -> bool:
        """AVX-512 VNNI's int8 dot product (vpdpbusd) for the GGUF kernels' integer path
        (strand/kernels/csrc/gguf_dot.h); below the avx512 level they use AVX2's maddubs pair.
        STRAND_DISABLE_VNNI (set at all) builds the avx512 level without it: the code an
        AVX-512 CPU without VNNI (Skylake-SP) runs, which CI covers this way on a CPU with VNNI."""
        return (self.level == "avx512" and "avx512_vnni" in self.flags
                and not envs.disable_vnni())

    @property
    def amx_bf16(self) -> bool:
        """AMX bfloat16 tiles (strand/kernels/csrc/prefill_attention_amx.cpp), at the avx512 level only:
        STRAND_CPU_ISA=avx2 never takes them. STRAND_DISABLE_AMX=1 turns them off (A/B runs,
        tests of the path without them)."""
        return (self.level == "avx512" and {"amx_bf16", "amx_tile"} <= self.flags
                and not envs.disable_amx())

    @property
    def avx512_bf16(self) -> bool:
        """AVX512_BF16's VDPBF16PS (Cooper Lake, Sapphire Rapids, Zen 4) at the avx512 level,
        for the bfloat16 prefill attention without AMX. STRAND_DISABLE_AVX512_BF16 (set at
        all) turns it off, as it does for the C++ kernels that test for it themselves."""
        return (self.level == "avx512" and "avx512_bf16" in self.flags
                and not envs.disable_avx512_bf16())

    def compile_flags(self) -> list[str]:
        """-march for the C++ kernels: the level's baseline, tuned for this CPU (tuning never
        changes which instructions run, so a cache built here is safe on any CPU of the level),
        plus VNNI where the CPU has it (the flags are part of the build's name: a CPU without it
        builds its own)."""
        if self.detected == "native":
            return ["-mcpu=native"] if self.machine.startswith(("aarch64", "arm")) else []
        return [_MARCH[self.level], "-mtune=native"] + (["-mavx512vnni"] if self.vnni else [])

    def describe(self) -> str:
        bf16 = "oneDNN" if self.onednn_bf16 else "torch (no AVX-512/AVX-NE-CONVERT)"
        cap = f" (capped by {ENV}; the CPU has {self.detected})" if self.overridden else ""
        int8 = {"avx512": "AVX-512 VNNI" if self.vnni else "AVX-512 (no VNNI)",
                "avx2": "AVX2"}.get(self.level, "scalar")
        amx = "AMX" if self.amx_bf16 else "not AMX"
        return (f"CPU ISA {self.level}{cap}; bfloat16 linear layers: {bf16}; GGUF int8 dot "
                f"products: {int8}; bfloat16 prefill attention: {amx}")


def _cpuinfo_field(names: tuple[str, ...]) -> str:
    """The first /proc/cpuinfo line's value whose key is one of `names` ("" if none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in names:
            return value.strip()
    return ""


def _cpu_flags() -> frozenset[str]:
    return frozenset(_cpuinfo_field(("flags", "Features")).split())


def _cpu_vendor() -> str:
    return _cpuinfo_field(("vendor_id",))


def _detect(machine: str, flags: frozenset[str]) -> str:
    if machine not in ("x86_64", "AMD64"):
        return "native"
    if not flags:  # no /proc/cpuinfo: ask torch, which probed the same CPU
        import torch

        capability = torch.backends.cpu.get_cpu_capability().lower()
        return "avx512" if capability.startswith("avx512") else (
            "avx2" if capability == "avx2" else "generic")
    for level in reversed(LEVELS[1:]):
        if _LEVEL_FLAGS[level] <= flags:
            return level
    return "generic"


def _requested() -> str | None:
    value = envs.cpu_isa()
    if not value:
        return None
    if value not in LEVELS:
        raise ValueError(f"{ENV} must be one of {', '.join(LEVELS)}, got {value!r}")
    return value


@functools.cache
def probe() -> CpuIsa:
    """The CPU's level and the one in force (STRAND_CPU_ISA), read once per process."""
    machine = platform.machine()
    flags = _cpu_flags()
    detected = _detect(machine, flags)
    level = detected
    requested = _requested()
    if requested is not None and detected != "native":
        if LEVELS.index(requested) > LEVELS.index(detected):
            raise ValueError(f"{ENV}={requested} is wider than this CPU ({detected}): code built "
                             f"for it would stop on an illegal instruction")
        level = requested
    return CpuIsa(machine=machine, detected=detected, level=level, flags=flags,
                  vendor=_cpu_vendor())


def apply_override() -> None:
    """Under STRAND_CPU_ISA, cap oneDNN, MKL and torch's own CPU kernels at the same level. They read
    these variables once, at first use, so this runs at import of `kernels`; a value set by the
    user wins."""
    if _requested() is None:
        return
    isa = probe()
    if isa.detected == "native":
        return
    for name, value in torch_isa_env(isa.level).items():
        os.environ.setdefault(name, value)
