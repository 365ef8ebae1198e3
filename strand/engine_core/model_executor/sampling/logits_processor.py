"""Custom logits processors through vLLM v1's LogitsProcessor interface.

A processor class is named in EngineArgs.logits_processors ("package.module:Class" or
"package.module.Class") and built once per engine with (engine_args, device, is_pin_memory).
Each step the sampler tells every processor which requests sit in which batch row
(update_state(BatchUpdate)), then calls apply(logits). A processor decides per request, from the
request's SamplingParams (typically params.extra_args), whether it acts on its row; its
validate_params classmethod refuses bad extra_args when the request is added.

Strand rebuilds the batch each step, so every BatchUpdate re-adds each row at its index (adding at
an index replaces what was there, as vLLM's contract allows) and removes the rows past the new
batch size; it never sends moves.
"""

from __future__ import annotations

import enum
import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from strand.engine_core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from strand.engine_core.model_executor.sampling_metadata import SamplingRow


class MoveDirectionality(enum.Enum):
    UNIDIRECTIONAL = enum.auto()  # a -> b
    SWAP = enum.auto()  # a <-> b


# (index, params, prompt token ids, output token ids so far)
AddedRequest = tuple[int, SamplingParams, list[int], list[int]]
MovedRequest = tuple[int, int, MoveDirectionality]


@dataclass(slots=True)
class BatchUpdate:
    batch_size: int
    removed: list[int] = field(default_factory=list)  # in this order: removed, added, moved
    added: list[AddedRequest] = field(default_factory=list)
    moved: list[MovedRequest] = field(default_factory=list)


class LogitsProcessor(ABC):
    """vLLM v1's interface (vllm.v1.sample.logits_processor.LogitsProcessor)."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Raise ValueError for options (extra_args) this processor cannot take."""
        return None

    @abstractmethod
    def __init__(self, engine_args: Any, device: torch.device, is_pin_memory: bool) -> None: ...

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [batch_size, vocab] float32; may edit in place; returns the result."""

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if it never changes a row's argmax: then greedy rows skip it (applied after
        temperature, to random rows' distribution only)."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """The batch's membership changed (None: it did not)."""


def resolve_logits_processor(name: str | type) -> type[LogitsProcessor]:
    """A class, or its qualified name ("pkg.mod:Class" or "pkg.mod.Class")."""
    if isinstance(name, type):
        cls: Any = name
    else:
        if not isinstance(name, str) or not name:
            raise ValueError(f"logits_processors entries must be classes or qualified names, "
                             f"got {name!r}")
        module_name, sep, attr = name.partition(":")
        if not sep:
            module_name, _, attr = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(f"logits_processors: cannot load {name!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, LogitsProcessor)):
        raise ValueError(f"logits_processors: {name!r} is not a LogitsProcessor subclass")
    return cls


def build_logits_processors(names: Sequence[str | type], engine_args: Any,
                            device: torch.device) -> list[LogitsProcessor]:
    pin = device.type == "cuda"
    return [resolve_logits_processor(n)(engine_args, device, pin) for n in names]


class LogitsProcessors:
    """The engine's custom processors, split as the sampler applies them."""

    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        self.all = list(processors)
        self.non_argmax_invariant = [p for p in self.all if not p.is_argmax_invariant()]
        self.argmax_invariant = [p for p in self.all if p.is_argmax_invariant()]
        self._batch_size = 0

    def __bool__(self) -> bool:
        return bool(self.all)

    def update_state(self, rows: Sequence[SamplingRow]) -> None:
        update = BatchUpdate(
            batch_size=len(rows),
            removed=list(range(len(rows), self._batch_size)),
            added=[(i, row.params, row.prompt_token_ids, row.output_token_ids)
                   for i, row in enumerate(rows)],
        )
        self._batch_size = len(rows)
        for processor in self.all:
            processor.update_state(update)
