"""MultiConnector: several connectors behind one, e.g. a CPU tier and a remote store.

Every child is asked for its hits; loads come from the first child that can supply any tokens
for a request (its tokens only); saves, resets and clears go to every child, with no
short-circuit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from strand.engine_core.connector.base import KVConnectorBase
from strand.engine_core.core.kv_cache_utils import BlockHash
from strand.engine_core.core.request import Request
from strand.engine_core.core.tier_reset import TierReset, connector_tiers

logger = logging.getLogger(__name__)


class MultiConnector(KVConnectorBase):
    def __init__(self, connectors: Sequence[KVConnectorBase]) -> None:
        if not connectors:
            raise ValueError("connectors must name at least one child connector")
        self.connectors = list(connectors)
        self.locations = tuple(loc for c in self.connectors for loc in c.locations)
        # req_id -> index of the child chosen to load it (set by get_num_new_matched_tokens).
        self._loader_of: dict[str, int] = {}

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        """Every child is asked (each may track lookups of its own, as vLLM's children do);
        the first with a hit serves the load, and is recorded as the request's loader."""
        self._loader_of.pop(request.request_id, None)
        found = 0
        for i, child in enumerate(self.connectors):
            num = child.get_num_new_matched_tokens(request, num_computed_tokens)
            if found == 0 and num > 0:
                self._loader_of[request.request_id] = i
                found = num
        return found

    def loader_of(self, request_id: str) -> int | None:
        """Index of the child chosen to load the request, until its blocks are allocated."""
        return self._loader_of.get(request_id)

    def update_state_after_alloc(self, request: Request, block_ids: Sequence[int],
                                 num_computed_tokens: int, num_external_tokens: int) -> None:
        chosen = self._loader_of.pop(request.request_id, None)
        for i, child in enumerate(self.connectors):
            child.update_state_after_alloc(request, block_ids, num_computed_tokens,
                                           num_external_tokens if i == chosen else 0)

    def build_connector_meta(self) -> tuple[object | None, ...] | None:
        metas = tuple(child.build_connector_meta() for child in self.connectors)
        return metas if any(m is not None for m in metas) else None

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> None:
        self._loader_of.pop(request.request_id, None)
        for child in self.connectors:
            child.request_finished(request, block_ids)

    def reset_cache(self) -> bool:
        # Every child is reset even after one fails (False or an exception); None (not
        # implemented) is not a failure.
        ok = True
        for child in self.connectors:
            try:
                result = child.reset_cache()
            except Exception:
                logger.exception("reset_cache() of %s failed", type(child).__name__)
                result = False
            ok = ok and result is not False
        return ok

    def reset_tiers(self) -> list[TierReset]:
        # Every child is reset even after one fails.
        return [tier for child in self.connectors for tier in connector_tiers(child)]

    def lookup(self, block_hashes: Sequence[BlockHash]) -> dict[str, int]:
        found: dict[str, int] = {}
        for child in self.connectors:
            for location, num in child.lookup(block_hashes).items():
                found[location] = max(found.get(location, 0), num)
        return found

    def clear(self, location: str) -> int | None:
        results = [child.clear(location) for child in self.connectors]
        counts = [r for r in results if r is not None]
        return sum(counts) if counts else None

    def start_load_kv(self, metadata: object | None, kv_caches: list[torch.Tensor]) -> None:
        if not isinstance(metadata, tuple):
            return
        for child, meta in zip(self.connectors, metadata, strict=True):
            if meta is not None:
                child.start_load_kv(meta, kv_caches)

    def save_kv(self, block_ids: Sequence[int], block_hashes: Sequence[BlockHash],
                kv_caches: list[torch.Tensor]) -> int:
        return sum(child.save_kv(block_ids, block_hashes, kv_caches) for child in self.connectors)
