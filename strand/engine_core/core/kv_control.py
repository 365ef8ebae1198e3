"""KV cache control, owned by the core beside the scheduler and its connector: clear one location,
look up how much of a prompt is cached.

Locations: "device" (the paged pool's prefix cache) and "cpu" (the offload tier, when a connector
provides one). The controller RPCs (Clear / Lookup on the gateway) are thin wrappers over these.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from strand.engine_core.core.kv_cache_utils import BlockHash, update_block_hashes
from strand.engine_core.core.request import Request
from strand.engine_core.core.scheduler import Scheduler
from strand.engine_core.sampling_params import SamplingParams

DEVICE = "device"
CPU = "cpu"
LOCATIONS = (DEVICE, CPU)


def new_event_id() -> str:
    return f"kv-clear-{uuid.uuid4().hex}"


def check_location(location: str) -> None:
    if location not in LOCATIONS:
        raise ValueError(f"location must be one of {list(LOCATIONS)}, got {location!r}")


def clear_location(scheduler: Scheduler, location: str) -> int:
    """Drop what one location caches; the number of tokens cleared.

    "device" forgets the prefixes of free blocks only: blocks running requests hold keep theirs.
    """
    check_location(location)
    if location == DEVICE:
        num_blocks = scheduler.kv_cache_manager.block_pool.evict_cached_free_blocks()
    else:
        connector = scheduler.kv_connector
        cleared = connector.clear(location) if connector is not None else None
        num_blocks = cleared or 0
    return num_blocks * scheduler.block_size


def prompt_block_hashes(scheduler: Scheduler, token_ids: Sequence[int]) -> list[BlockHash]:
    """The chained hashes of the full blocks of token_ids, as a request with no cache_salt."""
    probe = Request("kv-lookup", list(token_ids), SamplingParams())
    update_block_hashes(probe, scheduler.block_size, scheduler.hash_fn)
    return probe.block_hashes


def lookup_locations(scheduler: Scheduler, token_ids: Sequence[int]) -> dict[str, int]:
    """Per location, how many leading tokens of token_ids are cached there (whole blocks)."""
    found = dict.fromkeys(LOCATIONS, 0)
    if not token_ids or not (scheduler.enable_caching or scheduler.kv_connector is not None):
        return found
    hashes = prompt_block_hashes(scheduler, token_ids)
    if scheduler.enable_caching:
        table = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block
        num_device = 0
        for block_hash in hashes:
            if block_hash not in table:
                break
            num_device += 1
        found[DEVICE] = num_device * scheduler.block_size
    # The connector's tier answers with prefix caching off too (it is asked then, as vLLM does).
    connector = scheduler.kv_connector
    if connector is not None:
        for location, num_blocks in connector.lookup(hashes).items():
            if location in found and location != DEVICE:
                found[location] = num_blocks * scheduler.block_size
    return found
