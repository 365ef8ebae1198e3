"""Builders for connector tests: tiers over random caches, fake children, a dict-backed tier."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from strand.engine_core.connector.base import KVConnectorBase
from strand.engine_core.connector.cpu_tier import CPUBlockTier
from strand.engine_core.core.kv_cache_utils import BlockHash
from strand.engine_core.core.request import Request
from tests.engine_core.core.conftest import FakeRunner

NUM_LAYERS = 2
BLOCK_SIZE = 4
NUM_KV_HEADS = 2
HEAD_DIM = 8


def make_tier(num_slots: int) -> CPUBlockTier:
    return CPUBlockTier(num_slots, NUM_LAYERS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, torch.float32)


def random_kv_caches(num_blocks: int, seed: int = 0) -> list[torch.Tensor]:
    """One [2, num_blocks, block_size, num_kv_heads, head_dim] tensor per layer."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn((2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM), generator=gen)
            for _ in range(NUM_LAYERS)]


def block_of(kv_caches: list[torch.Tensor], block_id: int) -> torch.Tensor:
    """[num_layers, 2, block_size, num_kv_heads, head_dim]: one block across every layer."""
    return torch.stack([kv[:, block_id] for kv in kv_caches])


def hashes(*names: str) -> list[BlockHash]:
    return [name.encode() for name in names]


def fake_runner(dtype: torch.dtype = torch.float32, block_size: int = BLOCK_SIZE) -> Any:
    """What the factory reads off a ModelRunner."""
    model_config = SimpleNamespace(num_layers=NUM_LAYERS, num_kv_heads=NUM_KV_HEADS,
                                   head_dim=HEAD_DIM, dtype=dtype)
    return SimpleNamespace(model_config=model_config, block_size=block_size,
                           device=torch.device("cpu"), kv_caches=random_kv_caches(8))


def bytes_per_block(dtype: torch.dtype = torch.float32) -> int:
    return 2 * NUM_LAYERS * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM * dtype.itemsize


@dataclass
class RecordingConnector(KVConnectorBase):
    """A child that answers fixed values and records every call."""

    reset_answer: bool | None = None
    matched: int = 0
    location: str = "cpu"
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.locations = (self.location,)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        self.calls.append(("match", request.request_id))
        return self.matched

    def update_state_after_alloc(self, request: Request, block_ids: Sequence[int],
                                 num_computed_tokens: int, num_external_tokens: int) -> None:
        self.calls.append(("alloc", request.request_id, num_external_tokens))

    def build_connector_meta(self) -> object | None:
        return ("meta", id(self)) if self.matched else None

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> None:
        self.calls.append(("finished", request.request_id, tuple(block_ids)))

    def reset_cache(self) -> bool | None:
        self.calls.append(("reset",))
        return self.reset_answer

    def lookup(self, block_hashes: Sequence[BlockHash]) -> dict[str, int]:
        return {self.location: self.matched // BLOCK_SIZE}

    def clear(self, location: str) -> int | None:
        self.calls.append(("clear", location))
        return 3 if location == self.location else None

    def start_load_kv(self, metadata: object | None, kv_caches: list[torch.Tensor]) -> None:
        self.calls.append(("load", metadata))


class DictTierConnector(KVConnectorBase):
    """A tier over FakeRunner's fake cache: saves slot values by hash, loads them back.

    It claims every held leading block, without capping at the last token, so that the
    scheduler's own cap is what the tests see.
    """

    locations = ("cpu",)

    def __init__(self, runner: FakeRunner) -> None:
        self.runner = runner
        self.block_size = runner.block_size
        self.store: dict[BlockHash, list[int | None]] = {}
        self.pending: list[tuple[list[int | None], int]] = []
        self.num_loaded_blocks = 0

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        n = 0
        for block_hash in request.block_hashes[num_computed_tokens // self.block_size:]:
            if block_hash not in self.store:
                break
            n += 1
        return n * self.block_size

    def update_state_after_alloc(self, request: Request, block_ids: Sequence[int],
                                 num_computed_tokens: int, num_external_tokens: int) -> None:
        # Tokens, not blocks: a partial last block (the scheduler keeps the last prompt token
        # for the forward) is loaded whole; the forward rewrites its computed slots.
        start = num_computed_tokens // self.block_size
        end = -(-(num_computed_tokens + num_external_tokens) // self.block_size)
        for i in range(start, end):
            self.pending.append((self.store[request.block_hashes[i]], block_ids[i]))

    def build_connector_meta(self) -> object | None:
        meta, self.pending = self.pending, []
        return meta or None

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> None:
        for i in range(request.num_computed_tokens // self.block_size):
            self.store[request.block_hashes[i]] = list(self.runner.kv[block_ids[i]])

    def reset_cache(self) -> bool:
        self.store.clear()
        return True

    def start_load_kv(self, metadata: object | None, kv_caches: list[torch.Tensor]) -> None:
        assert isinstance(metadata, list)
        for values, block_id in metadata:
            self.runner.kv[block_id] = list(values)
            self.num_loaded_blocks += 1
