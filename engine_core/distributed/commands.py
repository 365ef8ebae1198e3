"""What rank 0 sends the worker ranks: one pickled Command per call, by a torch.distributed
broadcast over the gloo command group (broadcast_object_list), never a transport of our own."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from engine_core.config import CacheConfig, SchedulerConfig
from engine_core.core.sched_output import SchedulerOutput
from engine_core.distributed.parallel_state import CollectiveError, TPGroup
from engine_core.model_executor.model_config import ModelConfig

INIT = "init"  # build the runner from `spec`
NUM_BLOCKS = "num_blocks"  # determine_num_blocks, then an all-reduce MIN over ranks
INIT_KV = "init_kv"  # initialize_kv_cache(num_blocks)
EXECUTE = "execute"  # apply `sampled`, then execute_model(scheduler_output)
SHUTDOWN = "shutdown"


@dataclass(slots=True)
class WorkerSpec:
    """Everything a worker needs to build its runner: the engine's, so no rank can differ."""

    model_config: ModelConfig  # the full model's; each rank derives its shard
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    device: str  # "cpu" or "cuda" (a worker takes cuda:<local rank>)
    attention_backend: str | None
    seed: int
    cpu_threads: int | None


@dataclass(slots=True)
class Command:
    kind: str
    spec: WorkerSpec | None = None  # INIT
    num_blocks: int = 0  # INIT_KV
    scheduler_output: SchedulerOutput | None = None  # EXECUTE
    # EXECUTE: the tokens rank 0 sampled in the previous step (req_id -> token), which the
    # workers append before running this one (their copies of the requests stay rank 0's).
    sampled: dict[str, int] = field(default_factory=dict)


def broadcast_command(tp: TPGroup, command: Command | None) -> Command:
    """Rank 0 passes the command; every other rank passes None and gets it back."""
    box: list[object] = [command]
    try:
        dist.broadcast_object_list(box, src=0, group=tp.command_group)
    except RuntimeError as e:
        raise CollectiveError(f"rank {tp.rank}: command broadcast over {tp.world_size} ranks "
                              f"failed: {e}") from e
    received = box[0]
    if not isinstance(received, Command):
        raise CollectiveError(f"rank {tp.rank}: expected a Command from rank 0, got "
                              f"{type(received).__name__}")
    return received
