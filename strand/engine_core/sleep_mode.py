"""Sleep mode (vLLM's LLMEngine.sleep/wake_up): give back the device memory between uses.

Level 1 offloads the weights to (pinned) CPU memory and drops the KV cache; level 2 drops both
and reloads the weights from the model directory on wake_up. On a CPU device the weights
already live in host memory, so level 1 only drops the KV cache there.
"""

from __future__ import annotations

import torch

from strand.engine_core.errors import EngineSleepingError
from strand.engine_core.model_executor.layers.cpu_weights import prepare_cpu_weights
from strand.engine_core.model_executor.loader import load_model
from strand.engine_core.model_executor.model_runner import ModelRunner

TAGS = ("weights", "kv_cache")
__all__ = ["TAGS", "EngineSleepingError", "SleepState"]


class SleepState:
    """What is asleep for one runner, and how to bring it back."""

    def __init__(self) -> None:
        self.asleep: set[str] = set()
        self.level = 0
        # name -> host copy of each parameter/buffer while offloaded (level 1 on CUDA).
        self._host: dict[str, torch.Tensor] = {}

    def is_sleeping(self) -> bool:
        return bool(self.asleep)

    def sleep(self, runner: ModelRunner, level: int) -> None:
        if level not in (1, 2):
            raise ValueError(f"level must be 1 or 2, got {level!r}")
        if self.asleep:
            raise ValueError("the engine is already sleeping (call wake_up first)")
        # Graphs and caches hold the KV tensors: release both so the memory is really freed.
        runner.decode_graphs = None
        runner.kv_caches = []
        if level == 2:
            # The weights go (each tensor emptied, so nothing keeps them); wake_up reloads.
            for _, tensor in _tensors(runner.model):
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        elif runner.device.type != "cpu":
            pin = torch.cuda.is_available()
            for name, tensor in _tensors(runner.model):
                host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu",
                                   pin_memory=pin)
                host.copy_(tensor, non_blocking=False)
                self._host[name] = host
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
            torch.cuda.empty_cache()
        self.level = level
        self.asleep = set(TAGS)

    def wake_up(self, runner: ModelRunner, num_blocks: int,
                tags: list[str] | None = None) -> None:
        wanted = list(TAGS) if tags is None else list(tags)
        bad = [t for t in wanted if t not in TAGS]
        if bad:
            raise ValueError(f"tags must be among {list(TAGS)}, got {bad}")
        if "weights" in wanted and "weights" in self.asleep:
            self._wake_weights(runner)
            self.asleep.discard("weights")
        if "kv_cache" in wanted and "kv_cache" in self.asleep:
            runner.initialize_kv_cache(num_blocks)
            self.asleep.discard("kv_cache")
        if not self.asleep:
            self.level = 0

    def _wake_weights(self, runner: ModelRunner) -> None:
        if self.level == 2:
            runner.model = load_model(runner.model_config, runner.device,
                                      max_positions=runner.scheduler_config.max_model_len)
            if runner.device.type == "cpu":
                prepare_cpu_weights(runner.model)
            return
        for name, tensor in _tensors(runner.model):
            host = self._host.pop(name, None)
            if host is not None:
                tensor.data = host.to(runner.device, non_blocking=False)
        self._host.clear()


def _tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]
