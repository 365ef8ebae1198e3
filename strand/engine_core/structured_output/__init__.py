"""Structured outputs (vLLM's StructuredOutputsParams) through xgrammar: compiled grammars, one
matcher per request, and the token bitmask the sampler applies to a step's batch."""

from strand.engine_core.structured_output.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
