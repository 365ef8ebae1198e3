"""Pure helpers of the model runner's step: a schedule's sanity check, and the sampler's rows
spread back over the scheduler's request order."""

from __future__ import annotations

import numpy as np

from strand.engine_core.core.runner_output import LogprobsLists


def check_schedule(req_ids: list[str], seq_lens: np.ndarray, known: np.ndarray,
                    capacity: np.ndarray) -> None:
    over = np.nonzero(seq_lens > known)[0]
    if over.size:
        i = int(over[0])
        raise ValueError(f"request {req_ids[i]!r}: num_computed_tokens + num_scheduled_tokens "
                         f"({int(seq_lens[i])}) must be <= its known tokens ({int(known[i])})")
    short = np.nonzero(seq_lens > capacity)[0]
    if short.size:
        i = int(short[0])
        raise ValueError(f"request {req_ids[i]!r}: {int(seq_lens[i])} tokens need more KV "
                         f"blocks than its block table holds ({int(capacity[i])} slots)")


def spread_logprobs(lists: LogprobsLists | None, sample_reqs: np.ndarray,
                     num_reqs: int) -> LogprobsLists | None:
    """Sampler rows (sampled requests only) -> rows aligned with req_ids; [] where not sampled."""
    if lists is None:
        return None
    ids: list[list[int]] = [[] for _ in range(num_reqs)]
    values: list[list[float]] = [[] for _ in range(num_reqs)]
    ranks = [0] * num_reqs
    for j, i in enumerate(sample_reqs.tolist()):
        ids[i] = lists.logprob_token_ids[j]
        values[i] = lists.logprobs[j]
        ranks[i] = lists.sampled_token_ranks[j]
    return LogprobsLists(ids, values, ranks)
