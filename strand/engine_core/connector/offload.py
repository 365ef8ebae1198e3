"""OffloadConnector: a CPU tier behind the device pool, keyed by the same chained block hashes.

The engine runs it in the runner's process, so both sides live in one object. A request's
computed full blocks are copied to the tier when it lets go of them (finish, abort, preemption),
while it still holds them: a block is never read after the pool could have reused it. A device
prefix-cache miss the tier can serve is loaded into freshly allocated blocks before the forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from strand.engine_core.connector.base import KVConnectorBase
from strand.engine_core.connector.cpu_tier import CPUBlockTier
from strand.engine_core.core.kv_cache_utils import BlockHash
from strand.engine_core.core.request import Request
from strand.engine_core.core.tier_reset import TierReset

LOCATION = "cpu"


@dataclass(slots=True)
class OffloadMetadata:
    """One step's loads: tier slot i goes into device block block_ids[i]."""

    slots: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)


class OffloadConnector(KVConnectorBase):
    locations = (LOCATION,)

    def __init__(self, tier: CPUBlockTier, block_size: int,
                 get_kv_caches: Callable[[], list[torch.Tensor]]) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.tier = tier
        self.block_size = block_size
        # A getter, not the list: the runner may allocate its caches after the connector.
        self._get_kv_caches = get_kv_caches
        self._pending = OffloadMetadata()

    # ---- scheduler side ----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        start = num_computed_tokens // self.block_size
        # The last token is always computed: its logits are needed.
        limit = (request.num_tokens - 1) // self.block_size
        return self.tier.num_leading_hits(request.block_hashes, start, limit) * self.block_size

    def update_state_after_alloc(self, request: Request, block_ids: Sequence[int],
                                 num_computed_tokens: int, num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        # The scheduler takes external hits in tokens: a partial last block is loaded whole.
        start = num_computed_tokens // self.block_size
        end = -(-(num_computed_tokens + num_external_tokens) // self.block_size)
        self._pending.slots.extend(self.tier.acquire(request.block_hashes[start:end]))
        self._pending.block_ids.extend(block_ids[start:end])

    def build_connector_meta(self) -> OffloadMetadata | None:
        if not self._pending.slots:
            return None
        meta, self._pending = self._pending, OffloadMetadata()
        return meta

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> None:
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_hashes),
                       len(block_ids))
        if num_full > 0:
            self.save_kv(block_ids[:num_full], request.block_hashes[:num_full],
                         self._get_kv_caches())

    def reset_cache(self) -> bool:
        self.tier.clear()
        return True

    def reset_tiers(self) -> list[TierReset]:
        return [TierReset(LOCATION, True, self.tier.clear())]

    def lookup(self, block_hashes: Sequence[BlockHash]) -> dict[str, int]:
        return {LOCATION: self.tier.num_leading_hits(block_hashes)}

    def clear(self, location: str) -> int | None:
        if location != LOCATION:
            return None
        return self.tier.clear()

    # ---- worker side -------------------------------------------------------------------------

    def start_load_kv(self, metadata: object | None, kv_caches: list[torch.Tensor]) -> None:
        if isinstance(metadata, OffloadMetadata) and metadata.slots:
            self.tier.load(metadata.slots, metadata.block_ids, kv_caches)

    def save_kv(self, block_ids: Sequence[int], block_hashes: Sequence[BlockHash],
                kv_caches: list[torch.Tensor]) -> int:
        if not kv_caches:
            return 0
        return self.tier.save(block_ids, block_hashes, kv_caches)
