"""Request: the engine core's view of one sequence (one child of an n>1 request)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.pooling.params import PoolingParams
from strand.engine_core.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    # Everything after this is finished.
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


def finish_reason_of(status: RequestStatus) -> str | None:
    return _FINISH_REASONS.get(status)


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    arrival_time: float = field(default_factory=time.time)
    priority: int = 0
    cache_salt: str | None = None
    lora_request: LoRARequest | None = None
    max_tokens: int = 16  # resolved by the core: params.max_tokens or what max_model_len leaves
    # Speculative decoding is on and its sampling can verify several tokens at once (set by
    # the scheduler: spec_decode.config.drafts_allowed).
    drafts_allowed: bool = False
    # An embedding request (runner="pooling"): sampling_params is then its carrier (one step
    # past the prompt at most, never sampled), and it finishes when its prompt is computed.
    pooling_params: PoolingParams | None = None
    # Its pooling reads every prompt position's hidden state (MEAN, CLS).
    pools_every_position: bool = False
    deadline: float | None = None  # time.time() past which it is dropped (EngineCoreRequest's)

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # prompt + output: the runner and the hasher read from here.
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first schedule; -1 until then
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    # Chained hashes of the full blocks of all_token_ids, appended as blocks fill.
    block_hashes: list[bytes] = field(default_factory=list)
    first_scheduled_time: float | None = None
    scheduled_time_reported: bool = False  # its first output carried first_scheduled_time
    # Preemptions (time.time()) its next output reports (then emptied).
    unreported_preemptions: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)

    def take_first_scheduled_time(self) -> float | None:
        """first_scheduled_time for the request's first output, None for every later one (an
        output reports an event once, as its preemptions)."""
        if self.scheduled_time_reported:
            return None
        self.scheduled_time_reported = True
        return self.first_scheduled_time

    def take_preemption_times(self) -> list[float] | None:
        """The preemption times not yet reported in an output (None when there are none)."""
        if not self.unreported_preemptions:
            return None
        times, self.unreported_preemptions = self.unreported_preemptions, []
        return times

    @property
    def skips_cached_prefix(self) -> bool:
        """Every prompt position must be computed (prompt logprobs, or pooling that reads them
        all): no prefix-cache or connector hit may skip one."""
        return self.sampling_params.prompt_logprobs is not None or self.pools_every_position

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finish_reason(self) -> str | None:
        return finish_reason_of(self.status)
