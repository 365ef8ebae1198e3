"""The gated MLP activations: act(gate) * up over a fused [gate | up] projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from strand.kernels import cpu_elementwise

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


def act_and_mul(gate_up: torch.Tensor, act: str) -> torch.Tensor:
    """[num_tokens, 2 * inter] -> [num_tokens, inter]: act(gate) * up."""
    if act == "silu":
        if cpu_elementwise.applies(gate_up):
            return cpu_elementwise.silu_and_mul(gate_up)  # one pass on CPU (C++)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    if act == "gelu_pytorch_tanh":  # Gemma
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up
    raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
