"""One engine's KV events as the gateway passed them on: its epoch, the set of hashes it caches
(the last snapshot with every later batch applied) and the last REPLAY_BATCHES batches, so a
SubscribeKvEvents client resumes from the seq it expects next, or gets a snapshot batch (the whole
cache) where that is no longer kept. Plain Python: no transport."""

from __future__ import annotations

from collections import deque

from strand.services._proto.strand.v1 import types_pb2 as pb

REPLAY_BATCHES = 1_000  # per engine, kept for subscribers that resume


class KvEventLog:
    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.epoch = ""  # unknown until the engine's first snapshot
        self.next_seq = 0  # the seq of the next batch
        self._hashes: dict[bytes, None] = {}  # insertion-ordered set
        self._replay: deque[pb.KvEventBatch] = deque(maxlen=REPLAY_BATCHES)

    @property
    def known(self) -> bool:
        return bool(self.epoch)

    def reset(self, epoch: str, hashes: list[bytes], next_seq: int) -> pb.KvEventBatch:
        """A new snapshot from the engine (it restarted, or the gateway lost its place): the
        batches kept so far cannot be resumed from. The snapshot batch to pass on."""
        self.epoch = epoch
        self.next_seq = next_seq
        self._hashes = dict.fromkeys(hashes)
        self._replay.clear()
        return self.snapshot_batch()

    def append(self, batch: pb.KvEventBatch) -> None:
        """A batch passed on: kept, and applied to the hashes."""
        self._replay.append(batch)
        self.next_seq = batch.seq + 1
        for event in batch.events:
            kind = event.WhichOneof("kind")
            if kind == "block_stored":
                self._hashes.update(dict.fromkeys(event.block_stored.block_hashes))
            elif kind == "block_removed":
                for digest in event.block_removed.block_hashes:
                    self._hashes.pop(digest, None)
            elif kind == "all_blocks_cleared":
                self._hashes.clear()

    def snapshot_batch(self) -> pb.KvEventBatch:
        batch = pb.KvEventBatch(seq=self.next_seq, engine=self.engine, epoch=self.epoch,
                                snapshot=True)
        batch.events.add(all_blocks_cleared=pb.AllBlocksCleared())
        if self._hashes:
            batch.events.add(block_stored=pb.BlockStored(block_hashes=list(self._hashes)))
        return batch

    def replay(self, start_seq: int, epoch: str) -> list[pb.KvEventBatch] | None:
        """The kept batches from start_seq on; None where they are not all kept (another epoch,
        or too far back): the subscriber gets snapshot_batch() instead."""
        if epoch != self.epoch or start_seq > self.next_seq:
            return None
        if start_seq == self.next_seq:
            return []
        if not self._replay or self._replay[0].seq > start_seq:
            return None
        return [b for b in self._replay if b.seq >= start_seq]

    def opening(self, resume: tuple[int, str] | None) -> list[pb.KvEventBatch]:
        """What a new subscriber gets first: the replay it asked for, else a snapshot batch."""
        if not self.known:
            return []  # the snapshot batch comes when the engine's first snapshot does
        if resume is not None:
            kept = self.replay(*resume)
            if kept is not None:
                return kept
        return [self.snapshot_batch()]
