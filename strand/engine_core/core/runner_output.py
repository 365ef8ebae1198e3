"""ModelRunnerOutput: what one forward pass produced, in the scheduler's request order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the tokenizer and detokenizer stages load no torch
    import torch


@dataclass(slots=True)
class LogprobsLists:
    """Per sampled row: top-k ids + the sampled id first, their logprobs and ranks."""

    # [num_rows][1 + k]: column 0 is the sampled (or prompt) token, then the top-k.
    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    # [num_rows]: rank of the token in column 0 (1 = most likely).
    sampled_token_ranks: list[int]


@dataclass(slots=True)
class ModelRunnerOutput:
    req_ids: list[str]  # every request that was scheduled this step
    req_id_to_index: dict[str, int]  # req_id -> row in the lists below
    # One list per request: the token sampled this step, or [] for a partial prefill chunk.
    sampled_token_ids: list[list[int]]
    # Rows aligned with req_ids when any request asked for logprobs; else None.
    logprobs: LogprobsLists | None = None
    # req_id -> logprobs for the prompt positions computed this step (rows = positions).
    prompt_logprobs_dict: dict[str, LogprobsLists | None] = field(default_factory=dict)
    # req_id -> one row per token, for a request that verified drafts and asked for logprobs
    # (its row in `logprobs` is then empty).
    draft_logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    # A pooling runner: req_id -> its embedding (float32, CPU, not normalized), for each request
    # whose prompt ended this step. Its sampled list is then empty.
    pooler_output: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> ModelRunnerOutput:
        return cls([], {}, [])
