"""KVConnectorBase: the interface between the engine and an external KV tier.

A connector has two sides, as in vLLM v1:
 - scheduler side (no tensors): how many extra leading prompt tokens the tier can supply for a
   request, what to load once blocks are allocated, what to save when a request lets go of its
   blocks, and reset_cache();
 - worker side: load blocks into the paged cache before the forward pass (driven by the metadata
   the scheduler side built for that step), save blocks out of it.

Life of one request with a connector:
 1. schedule(): the device prefix cache gives N computed tokens; get_num_new_matched_tokens()
    says how many more leading tokens (whole blocks) the tier holds;
 2. the scheduler allocates blocks for the hit and the rest, then update_state_after_alloc()
    records which tier blocks go into which device blocks; build_connector_meta() hands the plan
    to the runner in SchedulerOutput.kv_connector_metadata;
 3. execute_model(): start_load_kv() copies tier -> device before the forward;
 4. finish, abort or preemption: request_finished() saves the request's computed full blocks.

Every method has a harmless default so a connector implements only what it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from strand.engine_core.core.kv_cache_utils import BlockHash
from strand.engine_core.core.request import Request

if TYPE_CHECKING:  # the scheduler imports this module and stays free of torch
    import torch


class KVConnectorBase:
    # The location name this connector's tier answers to in lookup/clear (e.g. "cpu").
    locations: tuple[str, ...] = ()

    # ---- scheduler side ----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        """Leading tokens after num_computed_tokens (a block multiple) the tier can supply.

        Must stay below request.num_tokens: the last token is always computed. Side-effect free.
        """
        return 0

    def update_state_after_alloc(self, request: Request, block_ids: Sequence[int],
                                 num_computed_tokens: int, num_external_tokens: int) -> None:
        """Blocks are allocated: plan loading num_external_tokens tokens from the tier into
        block_ids (the request's whole block table), starting at num_computed_tokens."""

    def build_connector_meta(self) -> object | None:
        """The plan for this step's worker side; clears the scheduler side's pending state."""
        return None

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> None:
        """The request is about to free block_ids (finish, abort or preemption); its first
        request.num_computed_tokens tokens are computed and still in those blocks."""

    def reset_cache(self) -> bool | None:
        """Empty the tier. True: done; False: failed; None: not implemented (counts as done)."""
        return None

    def lookup(self, block_hashes: Sequence[BlockHash]) -> dict[str, int]:
        """Per location: how many leading blocks of the chain the tier holds."""
        return {}

    def clear(self, location: str) -> int | None:
        """Empty one location; the number of blocks dropped, or None if not ours."""
        return None

    # ---- worker side -------------------------------------------------------------------------

    def start_load_kv(self, metadata: object | None, kv_caches: list[torch.Tensor]) -> None:
        """Copy the planned blocks into the paged cache; called before the forward pass."""

    def save_kv(self, block_ids: Sequence[int], block_hashes: Sequence[BlockHash],
                kv_caches: list[torch.Tensor]) -> int:
        """Copy full blocks out of the paged cache, keyed by their hashes; how many were new."""
        return 0
