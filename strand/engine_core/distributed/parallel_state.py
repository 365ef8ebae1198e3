"""The tensor-parallel group of this process: who it is (rank, world size) and the collectives the
sharded layers call, all on torch.distributed (gloo on CPU, NCCL on CUDA).

Two groups, as vLLM keeps them: the default group carries the layers' tensors (all-reduce,
gather) under a short timeout, so a rank that stops answering ends a step with an error instead of
a hang; a gloo group carries the pickled step messages from rank 0 under a long one, because a
worker waits there for as long as the engine is idle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from strand import envs

logger = logging.getLogger(__name__)

# A worker waits on the command group while the engine has nothing to do: days, not seconds.
COMMAND_TIMEOUT = timedelta(days=30)


@dataclass(slots=True)
class DistributedInit:
    """Where and how the ranks of one engine meet (torchrun's names)."""

    world_size: int  # tensor_parallel_size: every rank of every node
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    nnodes: int = 1
    node_rank: int = 0
    backend: str = "gloo"  # "gloo" (CPU) | "nccl" (CUDA)
    timeout_s: float = 60.0  # init_process_group and every collective of a step
    # Launched by torchrun: every rank is its own process already (none is spawned), and the
    # group meets at torchrun's store (init_method env://) instead of one rank 0 hosts.
    torchrun: bool = False

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.world_size}")
        if self.nnodes < 1 or self.world_size % self.nnodes:
            raise ValueError(f"nnodes must be >= 1 and divide tensor_parallel_size "
                             f"({self.world_size}), got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in [1, 65535], got {self.master_port}")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, got {self.backend!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"distributed_timeout_s must be > 0, got {self.timeout_s}")

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes

    def node_ranks(self) -> range:
        """The global ranks that run on this node."""
        first = self.node_rank * self.ranks_per_node
        return range(first, first + self.ranks_per_node)


@dataclass(slots=True)
class TPGroup:
    rank: int
    world_size: int
    local_rank: int  # index on this node (the CUDA device it uses)
    timeout_s: float
    command_group: dist.ProcessGroup | None = None
    # Seconds spent inside the layers' collectives since the last take_comm_time() (benchmarks).
    comm_seconds: float = field(default=0.0)

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place."""
        start = time.perf_counter()
        _checked(lambda: dist.all_reduce(x), "all_reduce", self)
        self.comm_seconds += time.perf_counter() - start
        return x

    def all_reduce_min(self, x: torch.Tensor) -> torch.Tensor:
        _checked(lambda: dist.all_reduce(x, op=dist.ReduceOp.MIN), "all_reduce(min)", self)
        return x

    def gather_to_driver(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Each rank's x (same shape everywhere); the list on rank 0, None elsewhere."""
        start = time.perf_counter()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.is_driver else None
        _checked(lambda: dist.gather(x.contiguous(), parts, dst=0), "gather", self)
        self.comm_seconds += time.perf_counter() - start
        return parts

    def take_comm_time(self) -> float:
        seconds, self.comm_seconds = self.comm_seconds, 0.0
        return seconds


class CollectiveError(RuntimeError):
    """A collective failed or timed out: some rank died or stopped answering."""


def _checked(call: Callable[[], object], what: str, group: TPGroup) -> None:
    try:
        call()
    except RuntimeError as e:
        raise CollectiveError(f"rank {group.rank}: {what} over {group.world_size} ranks failed "
                              f"(timeout {group.timeout_s:g}s): {e}") from e


def init_tp_group(init: DistributedInit, rank: int) -> TPGroup:
    """Join the engine's ranks; a clear error naming this rank when they do not all arrive."""
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialized in this process: one "
                           "tensor-parallel engine per process (shut the other one down first)")
    timeout = timedelta(seconds=init.timeout_s)
    url = "env://" if init.torchrun else f"tcp://{init.master_addr}:{init.master_port}"
    try:
        dist.init_process_group(init.backend, init_method=url, rank=rank,
                                world_size=init.world_size, timeout=timeout)
        command_group = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    except (RuntimeError, ValueError) as e:
        if dist.is_initialized():
            dist.destroy_process_group()
        else:
            # A failed init leaves torch's group counter at 1, and group names (hence store
            # keys) derive from it: the next engine of this process would wait on keys its fresh
            # workers never write. destroy_process_group resets it, but only after a success.
            c10d._world.group_count = 0
        raise CollectiveError(f"rank {rank}: init_process_group at {url} with "
                              f"{init.world_size} ranks did not complete within "
                              f"{init.timeout_s:g}s: {e}") from e
    logger.info("rank %d of %d joined at %s (%s)", rank, init.world_size, url, init.backend)
    return TPGroup(rank=rank, world_size=init.world_size,
                   local_rank=rank - init.node_rank * init.ranks_per_node,
                   timeout_s=init.timeout_s, command_group=command_group)


def torchrun_rank() -> int | None:
    """This process's rank when torchrun (torch.distributed.run) started it, else None."""
    env = envs.torchrun()
    return None if env is None else int(env["RANK"])


def torchrun_init(tensor_parallel_size: int, backend: str, timeout_s: float) -> DistributedInit:
    """torchrun's environment as a DistributedInit; ValueError when its world is not the
    engine's tensor_parallel_size."""
    env = envs.torchrun()
    if env is None:
        raise ValueError("torchrun_init needs the variables torchrun sets: "
                         f"{', '.join(envs.TORCHRUN_VARS)}")
    world, per_node = int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])
    if world != tensor_parallel_size:
        raise ValueError(f"tensor_parallel_size ({tensor_parallel_size}) must equal torchrun's "
                         f"WORLD_SIZE ({world}): one torchrun process per rank")
    return DistributedInit(world_size=world, master_addr=env["MASTER_ADDR"],
                           master_port=int(env["MASTER_PORT"]), nnodes=world // per_node,
                           node_rank=int(env["GROUP_RANK"]), backend=backend,
                           timeout_s=timeout_s, torchrun=True)


def destroy_tp_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
