"""What reset_prefix_cache did to each tier of the KV cache: the device's paged cache, then each
connector's store (the Control service reports these per tier)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TierReset:
    tier: str  # "device", or a connector tier's location ("cpu", ...)
    reset: bool  # emptied (False: refused or failed)
    num_blocks: int = 0  # cached blocks dropped
    num_bytes: int = 0  # for tiers that count bytes rather than blocks


def connector_tiers(connector: object) -> list[TierReset]:
    """Reset a connector; one TierReset per tier it holds. A connector that reports tiers
    (reset_tiers) says what each dropped; otherwise its reset_cache() says only whether it was
    emptied (None, not implemented, counts as done, as in vLLM)."""
    report = getattr(connector, "reset_tiers", None)
    if report is not None:
        return list(report())
    reset = getattr(connector, "reset_cache", None)
    try:
        ok = reset is None or reset() is not False
    except Exception:
        logger.exception("reset_cache() of %s failed", type(connector).__name__)
        ok = False
    return [TierReset(type(connector).__name__, ok)]
