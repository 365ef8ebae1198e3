"""Strand's engine core: the in-process API (vLLM's LLMEngine semantics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine_core.config import EngineArgs
from engine_core.outputs import CompletionOutput, Logprob, RequestOutput
from engine_core.sampling_params import RequestOutputKind, SamplingParams
from engine_core.structured_output.params import StructuredOutputsParams

if TYPE_CHECKING:
    from engine_core.llm import LLM
    from engine_core.llm_engine import LLMEngine

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineArgs",
    "LLMEngine",
    "Logprob",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "StructuredOutputsParams",
]


def __getattr__(name: str) -> Any:
    # Imported lazily: they pull in torch, which light users (the gateway) do not need.
    if name == "LLMEngine":
        from engine_core.llm_engine import LLMEngine

        return LLMEngine
    if name == "LLM":
        from engine_core.llm import LLM

        return LLM
    raise AttributeError(name)
