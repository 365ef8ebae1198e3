"""Builds a C++ CPU kernel module from kernels/csrc on first use (torch's cpp_extension).

The build needs a C++ compiler and ninja; it is cached under ~/.cache/torch_extensions (or
TORCH_EXTENSIONS_DIR) and redone when a source changes. Where it fails, or with
STRAND_DISABLE_CPU_KERNELS=1, `module()` is None, `unavailable_reason()` says why, and the
callers keep their pure-torch paths.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
# -march=native: the vector code uses the widest registers this CPU has (a cache carried to a
# different CPU needs rebuilding: delete the extension's cache directory).
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno"]


class CpuExtension:
    def __init__(self, name: str, source: str, extra_cflags: tuple[str, ...] = ()) -> None:
        self.name = name
        self.source = CSRC / source
        self.extra_cflags = list(extra_cflags)
        self._module: ModuleType | None = None
        self._error: str | None = None

    def module(self) -> ModuleType | None:
        if self._module is not None or self._error is not None:
            return self._module
        if os.environ.get("STRAND_DISABLE_CPU_KERNELS"):
            self._error = "disabled by STRAND_DISABLE_CPU_KERNELS"
            return None
        try:
            from torch.utils.cpp_extension import load

            logger.info("building the CPU kernels in %s (once; cached afterwards)", self.source.name)
            self._module = load(name=self.name, sources=[str(self.source)],
                                extra_include_paths=[str(CSRC)],
                                extra_cflags=_CFLAGS + self.extra_cflags,
                                extra_ldflags=["-fopenmp"])
        except Exception as exc:  # no compiler or ninja: keep the torch path, and say why once
            self._error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            logger.warning("CPU kernels in %s unavailable (%s); using the torch path",
                           self.source.name, self._error)
        return self._module

    def unavailable_reason(self) -> str | None:
        self.module()
        return self._error
