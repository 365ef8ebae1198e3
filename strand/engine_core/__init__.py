"""Strand's engine core: the in-process API (vLLM's LLMEngine semantics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strand.platform.huge_pages import configure_huge_pages
from strand.platform.openmp_env import configure_openmp_wait

# Before anything here imports torch (openmp_env.py and huge_pages.py say why).
configure_openmp_wait()
configure_huge_pages()

from strand.engine_core.config import EngineArgs  # noqa: E402
from strand.engine_core.lora.request import LoRARequest  # noqa: E402
from strand.engine_core.outputs import (  # noqa: E402
    ClassificationOutput,
    ClassificationRequestOutput,
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from strand.engine_core.pooling.params import PoolingParams  # noqa: E402
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402
from strand.engine_core.structured_output.params import StructuredOutputsParams  # noqa: E402

if TYPE_CHECKING:
    from strand.engine_core.async_llm import AsyncLLM
    from strand.engine_core.llm import LLM
    from strand.engine_core.llm_engine import LLMEngine

__all__ = [
    "LLM",
    "AsyncLLM",
    "ClassificationOutput",
    "ClassificationRequestOutput",
    "CompletionOutput",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "EngineArgs",
    "LLMEngine",
    "LoRARequest",
    "Logprob",
    "PoolingOutput",
    "PoolingParams",
    "PoolingRequestOutput",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "ScoringOutput",
    "ScoringRequestOutput",
    "StructuredOutputsParams",
]


def __getattr__(name: str) -> Any:
    # Imported lazily: they pull in torch, which light users (the gateway) do not need.
    if name == "LLMEngine":
        from strand.engine_core.llm_engine import LLMEngine

        return LLMEngine
    if name == "LLM":
        from strand.engine_core.llm import LLM

        return LLM
    if name == "AsyncLLM":
        from strand.engine_core.async_llm import AsyncLLM

        return AsyncLLM
    raise AttributeError(name)
