"""One phrase for the load log: what actually computes attention, not only the backend's name.

On CPU the "torch" backend hands plain causal layers to the C++ kernels when they are built
(strand/kernels/_cpu_build.py) and keeps torch's gather + SDPA path otherwise; the log must say which.
"""

from __future__ import annotations

import torch

from strand.engine_core.model_executor.attention.backend import AttentionBackend

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def describe_attention(backend: AttentionBackend, device: torch.device, dtype: torch.dtype) -> str:
    if backend.name != "torch" or device.type != "cpu":
        return backend.name
    if not getattr(backend, "use_cpu_kernel", False):
        return "torch SDPA (C++ CPU kernels off)"
    if dtype not in _KERNEL_DTYPES:
        return f"torch SDPA (no C++ CPU kernels for {dtype})"
    # Builds the kernels on first use (cached after): the answer is then what steps will use.
    from strand.kernels.cpu_decode_attention import is_available, unavailable_reason

    if is_available():
        return "C++ CPU kernels (paged decode and prefill; torch SDPA for windowed layers)"
    return f"torch SDPA (C++ CPU kernels unavailable: {unavailable_reason()})"
