"""A custom logits processor in vLLM v1's shape (as vLLM's tests use one): a request with
extra_args={"target_token": t} can only sample t."""

from __future__ import annotations

from typing import Any

import torch

from strand.engine_core.model_executor.sampling.logits_processor import BatchUpdate, LogitsProcessor
from strand.engine_core.sampling_params import SamplingParams


class DummyLogitsProcessor(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        target = (sampling_params.extra_args or {}).get("target_token")
        if target is not None and (not isinstance(target, int) or target < 0):
            raise ValueError(f"extra_args target_token must be a token id >= 0, got {target!r}")

    def __init__(self, engine_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.target_of: dict[int, int] = {}  # batch row -> target token

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is best

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.target_of.pop(index, None)
        for index, params, _, _ in batch_update.added:
            target = (params.extra_args or {}).get("target_token")
            if target is None:
                self.target_of.pop(index, None)
            else:
                self.target_of[index] = target
        for a, b, _ in batch_update.moved:
            self.target_of[a], self.target_of[b] = self.target_of.get(b), self.target_of.get(a)  # type: ignore[assignment]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, target in self.target_of.items():
            keep = logits[row, target].clone()
            logits[row].fill_(float("-inf"))
            logits[row, target] = keep
        return logits
