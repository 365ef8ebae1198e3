"""Blocks of the paged KV cache, their LRU free queue, and the chained block hash of prefix caching."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from strand.engine_core.core.request import Request

BlockHash = bytes
HashFn = Callable[[bytes], bytes]

HASH_ALGOS = ("sha256", "xxhash")


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _blake2b_128(data: bytes) -> bytes:
    # Used for "xxhash" when the xxhash package is absent: still cheaper than sha256 on short
    # inputs, and collisions stay negligible.
    return hashlib.blake2b(data, digest_size=16).digest()


def _fast_hash_fn() -> HashFn:
    try:
        import xxhash
    except ImportError:
        return _blake2b_128
    return xxhash.xxh3_128_digest  # type: ignore[no-any-return]


def get_hash_fn(algo: str) -> HashFn:
    """sha256 (default, collision resistant) or xxhash (fast, non-cryptographic)."""
    if algo == "sha256":
        return _sha256
    if algo == "xxhash":
        return _fast_hash_fn()
    raise ValueError(f"prefix_caching_hash_algo must be one of {HASH_ALGOS}, got {algo!r}")


# The parent of a request's first block: fixed, so hashes agree across processes and restarts.
NONE_HASH: BlockHash = hashlib.sha256(b"strand-prefix-cache-root").digest()


def hash_block_tokens(hash_fn: HashFn, parent_hash: BlockHash, token_ids: Sequence[int],
                      extra_keys: tuple[object, ...] | None = None) -> BlockHash:
    """Hash of one full block, chained on its parent so equal hashes mean equal prefixes."""
    # A full block has a fixed byte length, so the extra keys after it cannot be confused with
    # tokens; the parent hash has a fixed length too.
    data = parent_hash + array("q", token_ids).tobytes()
    if extra_keys:
        data += repr(extra_keys).encode()
    return hash_fn(data)


def block_extra_keys(request: Request, block_index: int) -> tuple[object, ...] | None:
    """Keys beyond token ids that change a block's KV: the tenant salt and the LoRA adapter id
    (an adapter changes every layer's K and V, so its blocks are never another's).

    Only the first block carries them: every later hash chains on it.
    """
    if block_index != 0:
        return None
    lora = request.lora_request
    return first_block_extra_keys(request.cache_salt,
                                  None if lora is None else lora.lora_int_id)


def first_block_extra_keys(cache_salt: str | None,
                           lora_int_id: int | None) -> tuple[object, ...] | None:
    """The first block's extra keys from the request's salt and adapter id: one definition
    for the engine and for whoever must reproduce its hashes (the data-parallel router)."""
    keys: tuple[object, ...] = ()
    if cache_salt is not None:
        keys = ("salt", cache_salt)
    if lora_int_id is not None:
        keys += ("lora", lora_int_id)
    return keys or None


def update_block_hashes(request: Request, block_size: int, hash_fn: HashFn) -> None:
    """Append the hashes of the blocks of request.all_token_ids that became full."""
    hashes = request.block_hashes
    num_full = len(request.all_token_ids) // block_size
    start = len(hashes)
    if start >= num_full:
        return
    tokens = request.all_token_ids
    parent = hashes[-1] if hashes else NONE_HASH
    for i in range(start, num_full):
        parent = hash_block_tokens(hash_fn, parent, tokens[i * block_size:(i + 1) * block_size],
                                   block_extra_keys(request, i))
        hashes.append(parent)


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    # Set once the block is full and cached; kept after it is freed until evicted.
    block_hash: BlockHash | None = None
    # Links of the free queue; None when the block is not in it (ends point to the sentinels).
    prev_free: KVCacheBlock | None = None
    next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks: evict from the head, O(1) removal from the middle.

    A deque cannot remove a block that a prefix hit revives without an O(n) scan.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.num_free_blocks = 0
        self._head = KVCacheBlock(-1)  # sentinels: no None checks on the hot path
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is None or block is self._tail:
            raise ValueError("no free blocks left in the KV cache pool")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Add at the tail: the last to be evicted."""
        last = self._tail.prev_free
        assert last is not None
        self._link(block, last, self._tail)

    def appendleft(self, block: KVCacheBlock) -> None:
        """Add at the head: the first to be evicted."""
        first = self._head.next_free
        assert first is not None
        self._link(block, self._head, first)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Add at the head, in the order given: the first of them is evicted first."""
        for block in reversed(blocks):
            self.appendleft(block)

    def _link(self, block: KVCacheBlock, prev: KVCacheBlock, nxt: KVCacheBlock) -> None:
        if block.prev_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        block.prev_free = prev
        block.next_free = nxt
        prev.next_free = block
        nxt.prev_free = block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Head to tail (eviction order). For tests and checks, not the hot path."""
        out = []
        node = self._head.next_free
        while node is not None and node is not self._tail:
            out.append(node)
            node = node.next_free
        return out


class BlockHashToBlockMap:
    """Prefix-cache table: block hash -> every cached block holding it (vLLM's map).

    Two requests can compute the same full block independently (neither found the other's in the
    cache when it was scheduled, e.g. prompt logprobs, or equal generated text): each keeps its
    own block and both stay cached, so freeing or evicting one leaves the other findable.
    """

    __slots__ = ("_table",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self) -> None:
        self._table: dict[BlockHash, dict[int, KVCacheBlock]] = {}

    def get(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """Any one block cached under block_hash (the earliest registered), or None."""
        blocks = self._table.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def get_all(self, block_hash: BlockHash) -> list[KVCacheBlock]:
        return list(self._table.get(block_hash, {}).values())

    def insert(self, block_hash: BlockHash, block: KVCacheBlock) -> None:
        self._table.setdefault(block_hash, {})[block.block_id] = block

    def pop(self, block_hash: BlockHash, block_id: int) -> KVCacheBlock | None:
        """Remove one block from the hash's entry; the hash stays while other blocks hold it."""
        blocks = self._table.get(block_hash)
        if blocks is None:
            return None
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._table[block_hash]
        return block

    def hashes(self) -> list[BlockHash]:
        """Every hash cached now, once each."""
        return list(self._table)

    def items(self) -> list[tuple[BlockHash, KVCacheBlock]]:
        """(hash, block) for every cached block (a hash appears once per block)."""
        return [(h, b) for h, blocks in self._table.items() for b in blocks.values()]

    def clear(self) -> None:
        self._table.clear()

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._table

    def __len__(self) -> int:
        """Distinct hashes cached."""
        return len(self._table)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockHashToBlockMap):
            return self._table == other._table
        # Compared with a plain dict of hash -> block (tests compare with {}).
        return isinstance(other, dict) and dict(self.items()) == other and len(
            self.items()) == len(other)
