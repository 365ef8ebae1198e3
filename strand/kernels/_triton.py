"""Triton availability, lazy kernel compilation, and which attention backends can run here."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from strand import envs

HAS_TRITON = importlib.util.find_spec("triton") is not None


def triton_interpret_enabled() -> bool:
    """TRITON_INTERPRET=1 runs kernels on CPU tensors through Triton's numpy interpreter."""
    return envs.triton_interpret()


def triton_usable() -> bool:
    """Triton kernels can launch: a CUDA device, or the CPU interpreter switched on."""
    return HAS_TRITON and (torch.cuda.is_available() or triton_interpret_enabled())


def runs_triton(t: torch.Tensor) -> bool:
    """Whether the model's layers take their Triton kernels for this tensor: on CUDA. (On CPU the
    interpreter is for tests of the kernels; the layers there have their own C++ kernels.)"""
    return t.is_cuda and HAS_TRITON


def flash_attn_importable() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def available_backends() -> list[str]:
    """Attention backends that can run here, best first; "torch" is always last."""
    backends: list[str] = []
    if torch.cuda.is_available() and flash_attn_importable():
        backends.append("flash_attn")
    if triton_usable():
        backends.append("triton")
    backends.append("torch")
    return backends


class LazyKernel:
    """`triton.jit` applied at first launch rather than at import.

    Triton decides between compiling and interpreting when `jit` runs, from TRITON_INTERPRET.
    Deferring it lets a test harness set that variable after this module was imported.
    """

    __slots__ = ("_fn", "_kernel")

    def __init__(self, fn: Callable[..., None]) -> None:
        self._fn = fn
        self._kernel: Any = None

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        if self._kernel is None:
            import triton

            if triton_interpret_enabled():
                _check_interpreter_ready()
            self._kernel = triton.jit(self._fn)
        return self._kernel[grid]


def _check_interpreter_ready() -> None:
    # Triton wraps its own library functions (tl.max, tl.sum, tl.cdiv) once, at import: an
    # import before TRITON_INTERPRET=1 was set leaves them compiled-only, and every kernel
    # calling them fails deep inside the interpreter.
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(standard.max, InterpretedFunction):
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after triton was imported; set it before the first "
            "`import triton` (e.g. at the top of the test session's conftest.py)")


def lazy_jit(fn: Callable[..., None]) -> LazyKernel:
    return LazyKernel(fn)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
