"""Messages in and out of the engine core: EngineCoreRequest in, EngineCoreOutput out.

These are what travel between the tokenizer, engine and detokenizer stages (as protobuf over gRPC).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from strand.engine_core.core.runner_output import LogprobsLists
from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.pooling.params import PoolingParams
from strand.engine_core.sampling_params import SamplingParams


@dataclass(slots=True)
class EngineCoreRequest:
    request_id: str  # one child: the output processor fans n>1 out into n of these
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float = field(default_factory=time.time)
    priority: int = 0
    cache_salt: str | None = None
    lora_request: LoRARequest | None = None  # the adapter it runs with; None: the base model
    # An embedding request (runner="pooling"); sampling_params is then PoolingParams.carrier().
    pooling_params: PoolingParams | None = None
    # time.time() past which nobody waits for it (the caller's deadline): the core drops it,
    # queued or running, at its next step with finish_reason "abort". None: no deadline.
    deadline: float | None = None


@dataclass(slots=True)
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]  # tokens appended this step (usually one)
    new_logprobs: LogprobsLists | None = None  # one row per new token when logprobs was asked
    new_prompt_logprobs: LogprobsLists | None = None  # rows for prompt positions computed now
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # stop token id that finished it
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    first_scheduled_time: float | None = None
    # When it was preempted since its previous output (time.time()); None: never.
    preempted_times: list[float] | None = None
    # Tokens of earlier steps that came with this output (the engine stage holds a FINAL_ONLY
    # request's tokens until it has something to say): each one's step time, oldest first.
    # They lead new_token_ids; this step's own tokens follow. None: all are this step's.
    held_times: list[float] | None = None
    # An embedding request's result, with its finish_reason: float32 values, normalized as its
    # PoolingParams asked.
    pooling_output: list[float] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def has_extras(self) -> bool:
        """Anything besides its tokens and cached-token count (the step message's extras; the
        engine stage never holds such an output back)."""
        # stop_reason is only ever set with a finish_reason.
        return (self.finish_reason is not None or self.first_scheduled_time is not None
                or self.new_logprobs is not None or self.new_prompt_logprobs is not None
                or bool(self.preempted_times) or bool(self.held_times)
                or self.pooling_output is not None)


@dataclass(slots=True)
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput]
    # Requests that finished inside the core this step (aborts from the core included).
    finished_requests: set[str] = field(default_factory=set)
    timestamp: float = field(default_factory=time.time)
    scheduler_stats: dict[str, float] | None = None
