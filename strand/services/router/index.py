"""Which replica holds which block hashes, mirrored from each replica's KV event batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from strand.engine_core.core.kv_cache_utils import (
    NONE_HASH,
    first_block_extra_keys,
    get_hash_fn,
    hash_block_tokens,
)
from strand.engine_core.core.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)


def prompt_block_hashes(token_ids: Sequence[int], block_size: int,
                        hash_algo: str = "sha256", cache_salt: str | None = None,
                        lora_int_id: int | None = None) -> list[bytes]:
    """The chained hashes of the prompt's full blocks, as the engine's prefix cache computes them
    (the salt and the LoRA adapter id key the first block there, so they do here)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    hash_fn = get_hash_fn(hash_algo)
    first_extra = first_block_extra_keys(cache_salt, lora_int_id)
    parent = NONE_HASH
    out: list[bytes] = []
    for i in range(len(token_ids) // block_size):
        extra = first_extra if i == 0 else None
        parent = hash_block_tokens(hash_fn, parent, token_ids[i * block_size:(i + 1) * block_size],
                                   extra)
        out.append(parent)
    return out


class KVIndex:
    """Per replica, the set of block hashes it has cached, and the next sequence it expects.

    A batch whose seq is not the expected one (events were lost) or an AllBlocksCleared makes
    that replica's mirror untrustworthy: it is cleared and on_resync(replica) is called so the
    owner can ask the replica for a full snapshot (or reset it). After a gap there is no resume
    point, so that snapshot is what the replica sends; after a clear, the mirror (empty) is exact
    and the stream resumes where it was.
    """

    def __init__(self, on_resync: Callable[[str], None] | None = None) -> None:
        self._blocks: dict[str, set[bytes]] = {}
        self._next_seq: dict[str, int] = {}
        self._epoch: dict[str, str] = {}  # the replica process's id its mirror belongs to
        self._on_resync = on_resync
        self.num_resyncs = 0

    def add_replica(self, replica: str) -> None:
        self._blocks.setdefault(replica, set())

    def remove_replica(self, replica: str) -> None:
        self._blocks.pop(replica, None)
        self._next_seq.pop(replica, None)
        self._epoch.pop(replica, None)

    def resume_point(self, replica: str) -> tuple[int, str] | None:
        """(the seq expected next, the epoch) to resume the replica's events from; None when
        the mirror needs a snapshot."""
        if replica not in self._next_seq or replica not in self._epoch:
            return None
        return self._next_seq[replica], self._epoch[replica]

    def replicas(self) -> list[str]:
        return list(self._blocks)

    def blocks(self, replica: str) -> set[bytes]:
        return self._blocks.get(replica, set())

    def apply(self, replica: str, batch: KVEventBatch) -> None:
        """Apply one batch in order; a gap or a clear triggers a resync of that replica."""
        if replica not in self._blocks:
            raise ValueError(f"replica must be added before its events, got {replica!r}")
        expected = self._next_seq.get(replica)
        self._next_seq[replica] = batch.seq + 1
        if batch.dropped or (expected is not None and batch.seq != expected):
            self._next_seq.pop(replica, None)  # no resume from a broken history
            self._resync(replica)
            return  # the batch is a fragment of an unknown history: the snapshot replaces it
        held = self._blocks[replica]
        for event in batch.events:
            if isinstance(event, BlockStored):
                held.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                held.difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                held.clear()
                self._resync(replica)

    def load_snapshot(self, replica: str, block_hashes: Sequence[bytes], next_seq: int,
                      epoch: str = "") -> None:
        """Replace a replica's mirror with a full snapshot taken just before batch next_seq (of
        a new epoch: a restarted replica, whose old blocks are all gone)."""
        self._blocks[replica] = set(block_hashes)
        self._next_seq[replica] = next_seq
        self._epoch[replica] = epoch

    def prefix_match(self, replica: str, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of hashes the replica holds (chained: stop at the first miss)."""
        held = self._blocks.get(replica, set())
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def _resync(self, replica: str) -> None:
        self._blocks[replica] = set()
        self.num_resyncs += 1
        if self._on_resync is not None:
            self._on_resync(replica)
