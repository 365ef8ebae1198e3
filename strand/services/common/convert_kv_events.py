"""engine_core's KV event batches <-> protobuf (strand.v1.KvEventBatch)."""

from __future__ import annotations

import time

from strand.engine_core.core.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from strand.services._proto.strand.v1 import types_pb2 as pb


def kv_event_batch_to_pb(batch: KVEventBatch, engine: str) -> pb.KvEventBatch:
    msg = pb.KvEventBatch(seq=batch.seq, timestamp=time.time(), engine=engine)
    for event in batch.events:
        if isinstance(event, BlockStored):
            stored = pb.BlockStored(block_hashes=event.block_hashes, token_ids=event.token_ids,
                                    block_size=event.block_size)
            if event.parent_block_hash is not None:
                stored.parent_block_hash = event.parent_block_hash
            msg.events.append(pb.KvEvent(block_stored=stored))
        elif isinstance(event, BlockRemoved):
            msg.events.append(pb.KvEvent(block_removed=pb.BlockRemoved(
                block_hashes=event.block_hashes)))
        elif isinstance(event, AllBlocksCleared):
            msg.events.append(pb.KvEvent(all_blocks_cleared=pb.AllBlocksCleared()))
    return msg


def kv_event_batch_from_pb(msg: pb.KvEventBatch) -> KVEventBatch:
    events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
    for event in msg.events:
        kind = event.WhichOneof("kind")
        if kind == "block_stored":
            s = event.block_stored
            parent = s.parent_block_hash if s.HasField("parent_block_hash") else None
            events.append(BlockStored(list(s.block_hashes), parent, list(s.token_ids),
                                      s.block_size))
        elif kind == "block_removed":
            events.append(BlockRemoved(list(event.block_removed.block_hashes)))
        elif kind == "all_blocks_cleared":
            events.append(AllBlocksCleared())
    return KVEventBatch(seq=msg.seq, events=events)
