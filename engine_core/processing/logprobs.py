"""LogprobsLists rows from the core -> vLLM's per-position dict[token id, Logprob]."""

from __future__ import annotations

from engine_core.core.runner_output import LogprobsLists
from engine_core.outputs import Logprob, PromptLogprobs, SampleLogprobs
from engine_core.processing.tokenizer import Tokenizer


class LogprobsProcessor:
    """Sample and prompt logprobs of one sequence; only kept when the request asked for them."""

    def __init__(
        self, tokenizer: Tokenizer, num_logprobs: int | None, num_prompt_logprobs: int | None
    ) -> None:
        self.tokenizer = tokenizer
        self.logprobs: SampleLogprobs | None = None if num_logprobs is None else []
        self.cumulative_logprob: float | None = None if num_logprobs is None else 0.0
        self.prompt_logprobs: PromptLogprobs | None = None if num_prompt_logprobs is None else []
        self._num_new_prompt_positions = 0  # prompt positions added since the last take

    def update_sample(self, rows: LogprobsLists | None) -> None:
        if rows is None or self.logprobs is None:
            return
        for position in _to_dicts(self.tokenizer, rows):
            self.logprobs.append(position)
            sampled_id = next(iter(position))  # column 0 is the sampled token
            assert self.cumulative_logprob is not None
            self.cumulative_logprob += position[sampled_id].logprob

    def update_prompt(self, rows: LogprobsLists | None) -> None:
        """Rows cover prompt positions 1.. in order, across chunks; position 0 has no logprob."""
        if rows is None or self.prompt_logprobs is None:
            return
        if not self.prompt_logprobs:
            self.prompt_logprobs.append(None)
            self._num_new_prompt_positions += 1
        positions = _to_dicts(self.tokenizer, rows)
        self.prompt_logprobs.extend(positions)
        self._num_new_prompt_positions += len(positions)

    def take_new_prompt_logprobs(self) -> PromptLogprobs | None:
        """The prompt positions added since the previous call (for DELTA outputs); None if none."""
        if self.prompt_logprobs is None:
            return None
        count = self._num_new_prompt_positions
        self._num_new_prompt_positions = 0
        return self.prompt_logprobs[len(self.prompt_logprobs) - count :] if count else None


def _to_dicts(tokenizer: Tokenizer, rows: LogprobsLists) -> list[dict[int, Logprob]]:
    positions: list[dict[int, Logprob]] = []
    for token_ids, logprobs, sampled_rank in zip(
        rows.logprob_token_ids, rows.logprobs, rows.sampled_token_ranks, strict=True
    ):
        ranks = [sampled_rank, *range(1, len(token_ids))]
        position: dict[int, Logprob] = {}
        for token_id, logprob, rank in zip(token_ids, logprobs, ranks, strict=True):
            # The sampled token may also be in the top-k: one entry, same rank either way.
            if token_id not in position:
                position[token_id] = Logprob(
                    logprob=logprob,
                    rank=rank,
                    decoded_token=tokenizer.decode([token_id], skip_special_tokens=False),
                )
        positions.append(position)
    return positions
