"""KV cache events (vLLM's KV events): what a prefix-aware router needs to mirror a cache.

The block pool records BlockStored when a hash first enters its prefix-cache map,
BlockRemoved when the last block under a hash leaves it, and AllBlocksCleared on a reset.
EngineCore.take_kv_events() drains them as one KVEventBatch with the next sequence number.
The buffer is bounded: when it overflows the oldest events are dropped and the next batch
says so (dropped > 0), and its seq skips as many numbers, so a subscriber sees the gap and
resyncs (clear its mirror, ask for a snapshot) instead of silently drifting.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[bytes]  # chained, in prefix order
    parent_block_hash: bytes | None  # the hash the first one chains on; None at the root
    token_ids: list[int]  # block_size tokens per hash, concatenated
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[bytes]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    seq: int  # increases by 1 per batch, and by 1 per dropped event on top
    events: list[KVEvent] = field(default_factory=list)
    dropped: int = 0  # events lost to overflow just before this batch


class KVEventBuffer:
    """Bounded FIFO of events; take() numbers each drained batch."""

    def __init__(self, max_events: int = 10_000) -> None:
        if max_events < 1:
            raise ValueError(f"kv_events_max_buffer must be >= 1, got {max_events}")
        self._events: deque[KVEvent] = deque()
        self._max = max_events
        self._dropped = 0
        self._next_seq = 0

    def __len__(self) -> int:
        return len(self._events)

    def record(self, event: KVEvent) -> None:
        if len(self._events) >= self._max:
            self._events.popleft()
            self._dropped += 1
        self._events.append(event)

    @property
    def next_seq(self) -> int:
        """The seq the next batch will carry when nothing is dropped before it."""
        return self._next_seq + self._dropped

    def take(self) -> KVEventBatch | None:
        """The pending events as one batch, or None when there is nothing (not even a gap)."""
        if not self._events and not self._dropped:
            return None
        # Each dropped event uses a sequence number, so seq alone shows the loss.
        seq = self._next_seq + self._dropped
        batch = KVEventBatch(seq=seq, events=list(self._events), dropped=self._dropped)
        self._next_seq = seq + 1
        self._events.clear()
        self._dropped = 0
        return batch
