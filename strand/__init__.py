"""Strand: an LLM inference engine with vLLM's LLMEngine semantics, split into gRPC services.

The three parts keep their own names: `strand.engine_core` (scheduler, paged KV cache, model
runner, processing), `strand.services` (the stages, gateway, OpenAI front, router, launcher) and
`strand.kernels` (Triton and C++ CPU kernels); `strand.platform` adapts to the machine and
`strand.testing` builds the tiny models that tests and the demo use.

The in-process API is importable from here, as `from vllm import LLM, SamplingParams` is:

    from strand import LLM, SamplingParams
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strand.engine_core import (
        LLM,
        AsyncLLM,
        ClassificationOutput,
        ClassificationRequestOutput,
        CompletionOutput,
        EmbeddingOutput,
        EmbeddingRequestOutput,
        EngineArgs,
        LLMEngine,
        Logprob,
        LoRARequest,
        PoolingOutput,
        PoolingParams,
        PoolingRequestOutput,
        RequestOutput,
        RequestOutputKind,
        SamplingParams,
        ScoringOutput,
        ScoringRequestOutput,
        StructuredOutputsParams,
    )

__version__ = "0.1.0"

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
    # Lazy: `import strand` stays cheap (no torch) for the gateway and for tools that only read
    # the version; the first use of a name imports the engine core.
    if name in __all__:
        import strand.engine_core as engine_core

        return getattr(engine_core, name)
    raise AttributeError(f"module 'strand' has no attribute {name!r}")
