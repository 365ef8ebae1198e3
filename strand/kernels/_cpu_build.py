"""Builds the CPU kernels in strand/kernels/csrc as one Python extension (torch's cpp_extension).

One extension, not one per kernel: the torch headers dominate the build, so the kernel sources
include only ATen's (strand/kernels/csrc/kernels.h) and one bindings file pays for pybind11. On 2 cores
that is about half a minute, once: the build goes to ~/.cache/torch_extensions (or
TORCH_EXTENSIONS_DIR) under a name made of the ISA level and a hash of the sources and flags, so a
cached build is found by its file alone, a changed source or another CPU level builds anew, and
nothing is printed when the build is there.

`ensure_built()` is called where a user expects the wait (`strand serve` / `strand demo` before
the stages start, the engine before it reports ready, `python -m strand.kernels.build`), with a progress
line every 15 s and the time it took. Where the build fails, or with STRAND_DISABLE_CPU_KERNELS=1,
`module()` is None, `unavailable_reason()` says why, and the callers keep their pure-torch paths.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from strand import envs
from strand.platform.cpu_isa import probe

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
_CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno"]
_PROGRESS_EVERY_S = 15.0


def _sources() -> list[Path]:
    return sorted(CSRC.glob("*.cpp"))


def _cflags() -> list[str]:
    return _CFLAGS + probe().compile_flags()


def extension_name() -> str:
    """strand_cpu_kernels_<level>_<hash of sources, headers, flags and torch version>."""
    digest = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cpp", ".h"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(" ".join(_cflags()).encode() + torch.__version__.encode())
    return f"strand_cpu_kernels_{probe().level}_{digest.hexdigest()[:12]}"


def build_dir() -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(extension_name(), verbose=False))


def is_cached() -> bool:
    return (build_dir() / f"{extension_name()}.so").is_file()


def _load_cached(name: str, directory: Path) -> ModuleType:
    """The built .so imported directly: torch's `load` would re-run ninja to check it."""
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.so")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Heartbeat:
    """Says, every 15 s, that the build is still going: a minute of silence reads as a hang."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._done = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="kernel-build-progress",
                                        daemon=True)

    def _run(self) -> None:
        while not self._done.wait(_PROGRESS_EVERY_S):
            self._say(f"  still building the CPU kernels ({time.monotonic() - self._start:.0f} s)")

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()


class CpuKernels:
    """The one extension, built or loaded at most once per process."""

    def __init__(self) -> None:
        self._module: ModuleType | None = None
        self._error: str | None = None
        self._lock = threading.Lock()

    def module(self, say: Callable[[str], None] | None = None) -> ModuleType | None:
        if self._module is not None:  # every kernel call asks: no lock once it is loaded
            return self._module
        with self._lock:
            if self._module is None and self._error is None:
                self._load(say or logger.info)
            return self._module

    def _load(self, say: Callable[[str], None]) -> None:
        if envs.disable_cpu_kernels():
            self._error = "disabled by STRAND_DISABLE_CPU_KERNELS"
            return
        try:
            name, directory = extension_name(), build_dir()
            if (directory / f"{name}.so").is_file():
                self._module = _load_cached(name, directory)
                return
            self._module = self._build(name, directory, say)
        except Exception as exc:  # no compiler or ninja: keep the torch path, and say why once
            self._error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            logger.warning("CPU kernels unavailable (%s); using the pure-torch path. Install a "
                           "C++ compiler (g++) to build them, or set STRAND_DISABLE_CPU_KERNELS=1 "
                           "to silence this", self._error)

    @staticmethod
    def _build(name: str, directory: Path, say: Callable[[str], None]) -> ModuleType:
        from torch.utils.cpp_extension import load

        isa = probe()
        say(f"building Strand's CPU kernels for {isa.level} (once; about 30-60 s on 2 cores) "
            f"into {directory}")
        start = time.monotonic()
        with _Heartbeat(say):
            module = load(name=name, sources=[str(p) for p in _sources()],
                          extra_include_paths=[str(CSRC)], extra_cflags=_cflags(),
                          extra_ldflags=["-fopenmp"], build_directory=str(directory))
        say(f"built the CPU kernels in {time.monotonic() - start:.0f} s")
        return module

    def built(self) -> ModuleType | None:
        """The module where it is loaded or built already (never a build: for callers with a
        fast enough fallback, which must not keep a first start waiting on a compile)."""
        if self._module is None and not is_cached():
            return None
        return self.module()

    def unavailable_reason(self) -> str | None:
        self.module()
        return self._error

    def require(self) -> ModuleType:
        """The module, for a caller that has no torch fallback: RuntimeError saying why where
        the kernels are unavailable."""
        module = self.module()
        if module is None:
            raise RuntimeError(f"CPU kernels unavailable: {self.unavailable_reason()}")
        return module


KERNELS = CpuKernels()


def ensure_built(say: Callable[[str], None] | None = None) -> str | None:
    """Build (or load) the CPU kernels now, saying so through `say` (default: the log) only when
    a build is needed. Returns None when they are usable, else why not."""
    KERNELS.module(say)
    return KERNELS.unavailable_reason()
