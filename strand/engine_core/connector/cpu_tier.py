"""CPUBlockTier: a bounded LRU store of whole KV blocks in host memory, keyed by block hash.

One preallocated buffer (pinned on CUDA, so copies can overlap) holds num_slots blocks of every
layer; a slot is reused only when no planned load still reads it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from strand.engine_core.core.kv_cache_utils import BlockHash


class CPUBlockTier:
    def __init__(self, num_slots: int, num_layers: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, pin_memory: bool = False) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        # [num_slots, num_layers, 2, block_size, num_kv_heads, head_dim]
        self.buffer = torch.zeros((num_slots, num_layers, 2, block_size, num_kv_heads, head_dim),
                                  dtype=dtype, pin_memory=pin_memory)
        # Least recently used first.
        self._slot_of: OrderedDict[BlockHash, int] = OrderedDict()
        self._free_slots: list[int] = list(range(num_slots - 1, -1, -1))
        # slot -> planned loads still reading it: such a slot is never overwritten.
        self._readers: dict[int, int] = {}
        # Slots dropped from the map while a load still reads them: freed when it is done.
        self._orphans: set[int] = set()
        # Tensor parallelism: each save as (block ids, slots), for the worker ranks to repeat
        # on their own heads (None: not recorded).
        self.journal: list[tuple[list[int], list[int]]] | None = None

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._slot_of

    def num_leading_hits(self, block_hashes: Sequence[BlockHash], start: int = 0,
                         limit: int | None = None) -> int:
        """How many of block_hashes[start:limit] are held, counting until the first miss."""
        end = len(block_hashes) if limit is None else min(limit, len(block_hashes))
        n = 0
        for i in range(start, end):
            if block_hashes[i] not in self._slot_of:
                break
            n += 1
        return n

    # ---- save --------------------------------------------------------------------------------

    def save(self, block_ids: Sequence[int], block_hashes: Sequence[BlockHash],
             kv_caches: list[torch.Tensor]) -> int:
        """Copy the blocks not yet held out of the paged caches; returns how many were stored.

        Blocks already held only move to the most recently used end. When every slot is being
        read by a planned load the rest are skipped: the tier is a cache, nothing depends on it.
        """
        ids: list[int] = []
        slots: list[int] = []
        for block_id, block_hash in zip(block_ids, block_hashes, strict=True):
            if block_hash in self._slot_of:
                self._slot_of.move_to_end(block_hash)
                continue
            slot = self._take_slot()
            if slot is None:
                break
            self._slot_of[block_hash] = slot
            ids.append(block_id)
            slots.append(slot)
        if ids:
            self.copy_out(ids, slots, kv_caches)
            if self.journal is not None:
                self.journal.append((ids, slots))
        return len(ids)

    def copy_out(self, block_ids: Sequence[int], slots: Sequence[int],
                 kv_caches: list[torch.Tensor]) -> None:
        """Paged cache blocks -> tier slots (no bookkeeping: what a worker rank repeats)."""
        index = torch.tensor(list(block_ids), dtype=torch.int64, device=kv_caches[0].device)
        # [num_layers, 2, n, block_size, num_kv_heads, head_dim] -> n first
        data = torch.stack([kv.index_select(1, index) for kv in kv_caches])
        self.buffer[torch.tensor(list(slots))] = data.permute(2, 0, 1, 3, 4, 5).cpu()

    def _take_slot(self) -> int | None:
        if self._free_slots:
            return self._free_slots.pop()
        for block_hash, slot in self._slot_of.items():  # LRU first
            if slot not in self._readers:
                del self._slot_of[block_hash]
                return slot
        return None

    # ---- load --------------------------------------------------------------------------------

    def acquire(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Slots of held blocks for a planned load, protected from reuse until release()."""
        slots = []
        for block_hash in block_hashes:
            slot = self._slot_of[block_hash]
            self._slot_of.move_to_end(block_hash)
            self._readers[slot] = self._readers.get(slot, 0) + 1
            slots.append(slot)
        return slots

    def load(self, slots: Sequence[int], block_ids: Sequence[int],
             kv_caches: list[torch.Tensor]) -> None:
        """Copy slots into the paged caches at block_ids, then release the slots."""
        if slots:
            self.copy_in(slots, block_ids, kv_caches)
        self.release(slots)

    def copy_in(self, slots: Sequence[int], block_ids: Sequence[int],
                kv_caches: list[torch.Tensor]) -> None:
        """Tier slots -> paged cache blocks (no bookkeeping: what a worker rank repeats)."""
        device = kv_caches[0].device
        # [n, num_layers, 2, block_size, num_kv_heads, head_dim]
        data = self.buffer[torch.tensor(list(slots))].to(device, non_blocking=True)
        index = torch.tensor(list(block_ids), dtype=torch.int64, device=device)
        for layer, kv in enumerate(kv_caches):
            kv.index_copy_(1, index, data[:, layer].transpose(0, 1))

    def release(self, slots: Sequence[int]) -> None:
        for slot in slots:
            left = self._readers[slot] - 1
            if left:
                self._readers[slot] = left
                continue
            del self._readers[slot]
            if slot in self._orphans:
                self._orphans.discard(slot)
                self._free_slots.append(slot)

    # ---- clear -------------------------------------------------------------------------------

    def clear(self) -> int:
        """Drop every block; returns how many were held."""
        num = len(self._slot_of)
        for slot in self._slot_of.values():
            if slot in self._readers:
                self._orphans.add(slot)
            else:
                self._free_slots.append(slot)
        self._slot_of.clear()
        return num
