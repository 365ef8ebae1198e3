"""The runner's copy of each running request, and the host arrays the step's inputs are cut from.

Every request owns one row of `token_ids` and `block_table`, so one step's input ids, positions and
slot mapping are a few numpy gathers over all requests, not a Python loop over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.sampling_params import SamplingParams

if TYPE_CHECKING:
    import xgrammar as xg


@dataclass(slots=True)
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # the runner's own copy: it appends what it samples
    params: SamplingParams
    generator: torch.Generator | None  # from params.seed; survives preemption
    eos_token_id: int | None
    block_ids: list[int]
    num_computed_tokens: int
    row: int  # row in InputBatch
    # Prompt positions whose prompt logprob row was already sent (survives preemption).
    prompt_logprobs_done: int = 0
    # params.structured_outputs' matcher, at the state after output_token_ids; made when the
    # request is first sampled (dropped with the state on preemption, then rebuilt).
    grammar: xg.GrammarMatcher | None = None
    lora_request: LoRARequest | None = None
    # Its token is the logits' argmax at every step (sampling_metadata.argmax_only).
    argmax_only: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class InputBatch:
    """Rows of token ids and block ids, grown (doubled) when a request outgrows them."""

    def __init__(self, num_rows: int, max_tokens: int, max_blocks: int) -> None:
        self.token_ids = np.zeros((max(num_rows, 1), max(max_tokens, 1)), dtype=np.int64)
        self.block_table = np.zeros((max(num_rows, 1), max(max_blocks, 1)), dtype=np.int32)
        self.num_blocks = np.zeros(max(num_rows, 1), dtype=np.int64)
        self._free_rows = list(range(self.token_ids.shape[0] - 1, -1, -1))

    def add(self, token_ids: list[int], block_ids: list[int]) -> int:
        if not self._free_rows:
            self._grow_rows()
        row = self._free_rows.pop()
        self._ensure_tokens(len(token_ids))
        self.token_ids[row, :len(token_ids)] = token_ids
        self.num_blocks[row] = 0
        self.append_blocks(row, block_ids)
        return row

    def remove(self, row: int) -> None:
        self._free_rows.append(row)

    def append_blocks(self, row: int, block_ids: list[int]) -> None:
        if not block_ids:
            return
        start = int(self.num_blocks[row])
        end = start + len(block_ids)
        if end > self.block_table.shape[1]:
            self.block_table = _grow_cols(self.block_table, end)
        self.block_table[row, start:end] = block_ids
        self.num_blocks[row] = end

    def set_token(self, row: int, index: int, token_id: int) -> None:
        self._ensure_tokens(index + 1)
        self.token_ids[row, index] = token_id

    def set_tokens(self, row: int, index: int, token_ids: list[int]) -> None:
        self._ensure_tokens(index + len(token_ids))
        self.token_ids[row, index:index + len(token_ids)] = token_ids

    def _ensure_tokens(self, n: int) -> None:
        if n > self.token_ids.shape[1]:
            self.token_ids = _grow_cols(self.token_ids, n)

    def _grow_rows(self) -> None:
        old = self.token_ids.shape[0]
        self.token_ids = np.concatenate([self.token_ids, np.zeros_like(self.token_ids)])
        self.block_table = np.concatenate([self.block_table, np.zeros_like(self.block_table)])
        self.num_blocks = np.concatenate([self.num_blocks, np.zeros_like(self.num_blocks)])
        self._free_rows.extend(range(2 * old - 1, old - 1, -1))


def _grow_cols(array: np.ndarray, at_least: int) -> np.ndarray:
    grown = np.zeros((array.shape[0], max(at_least, 2 * array.shape[1])), dtype=array.dtype)
    grown[:, :array.shape[1]] = array
    return grown
