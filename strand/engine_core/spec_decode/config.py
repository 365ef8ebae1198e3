"""Which requests prompt lookup may draft for. The config (SpeculativeConfig) is plain data in
strand/engine_core/speculative_config.py, beside EngineArgs."""

from __future__ import annotations

from strand.engine_core.sampling_params import SamplingParams


def drafts_allowed(params: SamplingParams) -> bool:
    """Whether a request's tokens may be drafted and verified several at once.

    Each draft row is processed with the drafts before it in the request's output (penalties,
    bad words and min_tokens read that), so only a grammar stands in the way: its matcher
    would have to walk the drafts. Such requests decode one token a step, beside drafted ones
    in the same batch.
    """
    return params.structured_outputs is None
