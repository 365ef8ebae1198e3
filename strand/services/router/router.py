"""Pick a replica per request: cached prefix length against load (SGLang's cache_aware idea).

kv-aware: each healthy replica scores
    cache_weight * (leading blocks it holds / request blocks) - load_weight * its load share
where the load share is (running + waiting) over the busiest replica's, plus its KV usage.
A replica already far busier than the idlest (balance_abs_threshold requests more and
balance_rel_threshold times as many) is skipped while others can take the request, so a hot
prefix cannot pile everything onto one replica. The chosen replica's blocks are recorded
optimistically (its events confirm or remove them later), so the next request with the same
prefix follows it before the events arrive.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from strand.engine_core.core.kv_events import KVEventBatch
from strand.services.router.index import KVIndex, prompt_block_hashes

POLICIES = ("kv-aware", "least-load", "round-robin")


@dataclass(slots=True)
class ReplicaLoad:
    running: int = 0
    waiting: int = 0
    free_blocks: int = 0
    total_blocks: int = 0

    @property
    def requests(self) -> int:
        return self.running + self.waiting

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 0.0


class Router:
    def __init__(self, replicas: Sequence[str], block_size: int, policy: str | None = None,
                 hash_algo: str = "sha256", cache_weight: float = 1.0, load_weight: float = 0.5,
                 balance_abs_threshold: int = 8, balance_rel_threshold: float = 2.0,
                 on_resync: Callable[[str], None] | None = None) -> None:
        if policy is None:
            policy = "kv-aware" if len(replicas) > 1 else "round-robin"
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.policy = policy
        self.block_size = block_size
        self.hash_algo = hash_algo
        self.cache_weight = cache_weight
        self.load_weight = load_weight
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.index = KVIndex(on_resync)
        self.loads: dict[str, ReplicaLoad] = {}
        self._rr = itertools.count()
        for r in replicas:
            self.add_replica(r)

    # Health: a replica that fails its checks is removed and never chosen until re-added.
    def add_replica(self, replica: str) -> None:
        self.loads.setdefault(replica, ReplicaLoad())
        self.index.add_replica(replica)

    def remove_replica(self, replica: str) -> None:
        self.loads.pop(replica, None)
        self.index.remove_replica(replica)

    def replicas(self) -> list[str]:
        return sorted(self.loads)

    def update_load(self, replica: str, load: ReplicaLoad) -> None:
        if replica in self.loads:
            self.loads[replica] = load

    def apply_events(self, replica: str, batch: KVEventBatch) -> None:
        if replica in self.loads:
            self.index.apply(replica, batch)

    def route(self, token_ids: Sequence[int], cache_salt: str | None = None,
              lora_int_id: int | None = None) -> str:
        """The replica for a prompt (run with adapter lora_int_id, None: the base model);
        ValueError when no replica is healthy."""
        replicas = self.replicas()
        if not replicas:
            raise ValueError("replicas must not be empty: no healthy replica to route to")
        if self.policy == "round-robin":
            return replicas[next(self._rr) % len(replicas)]
        if self.policy == "least-load":
            choice = min(replicas,
                         key=lambda r: (self.loads[r].requests, self.loads[r].kv_usage, r))
        else:
            hashes = prompt_block_hashes(token_ids, self.block_size, self.hash_algo, cache_salt,
                                         lora_int_id)
            choice = self._kv_aware(replicas, hashes)
            self.index.blocks(choice).update(hashes)  # optimistic: events confirm or correct it
        # Counted as waiting until the next update_load replaces it with the replica's own.
        self.loads[choice].waiting += 1
        return choice

    def cached_blocks(self, replica: str, token_ids: Sequence[int],
                      cache_salt: str | None = None, lora_int_id: int | None = None) -> int:
        hashes = prompt_block_hashes(token_ids, self.block_size, self.hash_algo, cache_salt,
                                     lora_int_id)
        return self.index.prefix_match(replica, hashes)

    def _kv_aware(self, replicas: list[str], hashes: list[bytes]) -> str:
        counts = {r: self.loads[r].requests for r in replicas}
        idlest = min(counts.values())
        # Too busy replicas sit this one out (unless every replica is).
        ok = [r for r in replicas
              if not (counts[r] - idlest > self.balance_abs_threshold
                      and counts[r] > self.balance_rel_threshold * max(idlest, 1))]
        busiest = max(counts.values()) or 1

        def score(r: str) -> tuple[float, int, str]:
            matched = self.index.prefix_match(r, hashes) / len(hashes) if hashes else 0.0
            load = counts[r] / busiest + self.loads[r].kv_usage
            # Ties: fewer requests, then name, so the choice is deterministic.
            return (self.cache_weight * matched - self.load_weight * load, -counts[r], r)

        best = max(ok, key=lambda r: score(r)[:2])
        top = [r for r in ok if score(r)[:2] == score(best)[:2]]
        return min(top)
