"""SchedulerOutput: what the scheduler decided for one step; the model runner executes it.

After a request is sent once (NewRequestData), only the diff travels (CachedRequestData).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    """A request the runner has not seen: first schedule, or resumed after preemption."""

    req_id: str
    prompt_token_ids: list[int]  # the prompt
    output_token_ids: list[int]  # tokens already generated (non-empty only when resumed)
    sampling_params: SamplingParams
    block_ids: list[int]  # the request's whole block table so far
    num_computed_tokens: int  # tokens whose KV is already in the cache (prefix hits included)
    # The request's EOS (min_tokens bans it); None: the runner falls back to the model's.
    eos_token_id: int | None = None
    lora_request: LoRARequest | None = None  # the adapter its tokens run through


@dataclass(slots=True)
class CachedRequestData:
    """Requests the runner already holds, one entry per list index."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)  # blocks appended this step
    num_computed_tokens: list[int] = field(default_factory=list)  # before this step's tokens

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]  # first seen by the runner this step
    scheduled_cached_reqs: CachedRequestData  # seen before, still running
    num_scheduled_tokens: dict[str, int]  # req_id -> tokens to compute this step
    total_num_scheduled_tokens: int  # sum of num_scheduled_tokens
    finished_req_ids: set[str]  # finished or aborted since the last step: runner drops them
    preempted_req_ids: set[str] = field(default_factory=set)  # runner drops them; resent as new
    # Block hashes / ids for the KV connector, when one is configured (opaque to the runner).
    kv_connector_metadata: object | None = None
    # req_id -> draft tokens scheduled after its last known token (counted in
    # num_scheduled_tokens); the runner verifies them and samples up to len + 1 tokens.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def num_reqs(self) -> int:
        return len(self.num_scheduled_tokens)

    @classmethod
    def empty(cls, finished_req_ids: set[str] | None = None) -> SchedulerOutput:
        return cls([], CachedRequestData(), {}, 0, finished_req_ids or set())
