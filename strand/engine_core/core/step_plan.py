"""Small pieces of one scheduler step: the running requests' plan while schedule() decides, and
one request's row of the step's sampled logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field

from strand.engine_core.core.kv_cache_utils import KVCacheBlock
from strand.engine_core.core.request import Request
from strand.engine_core.core.runner_output import LogprobsLists


def leading_rows(logprobs: LogprobsLists, n: int) -> LogprobsLists:
    """The first n rows (a drafted request's tokens up to the one that stopped it)."""
    return LogprobsLists(logprobs.logprob_token_ids[:n], logprobs.logprobs[:n],
                         logprobs.sampled_token_ranks[:n])


def logprobs_row(logprobs: LogprobsLists | None, index: int | None) -> LogprobsLists | None:
    """One request's row of this step's sampled logprobs."""
    if logprobs is None or index is None:
        return None
    return LogprobsLists([logprobs.logprob_token_ids[index]], [logprobs.logprobs[index]],
                         [logprobs.sampled_token_ranks[index]])


@dataclass(slots=True)
class RunningPlan:
    """What schedule() has decided for the running requests so far."""

    budget: int  # tokens still free this step
    num_scheduled: dict[str, int] = field(default_factory=dict)
    new_blocks_of: dict[str, list[KVCacheBlock]] = field(default_factory=dict)
    scheduled_running: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # req_id -> the draft tokens scheduled after its last token (speculative decoding).
    drafts: dict[str, list[int]] = field(default_factory=dict)
    may_draft: bool = False  # this step drafts (speculative decoding on, batch small enough)

    def unschedule(self, request: Request) -> None:
        """A request scheduled earlier in this step became a preemption victim."""
        if request.request_id in self.num_scheduled:
            self.budget += self.num_scheduled.pop(request.request_id)
            del self.new_blocks_of[request.request_id]
            self.drafts.pop(request.request_id, None)
            self.scheduled_running.remove(request)
