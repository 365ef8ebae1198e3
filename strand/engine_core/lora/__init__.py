"""LoRA adapters: requests (LoRARequest), PEFT loading, and batched application in the model."""

from __future__ import annotations

from strand.engine_core.lora.request import LoRARequest

__all__ = ["LoRARequest"]
