"""What rank 0 sends the worker ranks: one pickled Command per call, by a torch.distributed
broadcast over the gloo command group (as broadcast_object_list does), never a transport of our
own. Workers unpickle only what rank 0 of their own engine sent (as vLLM's workers do)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from strand.engine_core.config import CacheConfig, LoRAConfig, SchedulerConfig
from strand.engine_core.core.sched_output import SchedulerOutput
from strand.engine_core.distributed.parallel_state import CollectiveError, TPGroup
from strand.engine_core.model_executor.model_config import ModelConfig

INIT = "init"  # build the runner from `spec`
NUM_BLOCKS = "num_blocks"  # determine_num_blocks, then an all-reduce MIN over ranks
INIT_KV = "init_kv"  # initialize_kv_cache(num_blocks)
EXECUTE = "execute"  # apply `sampled`, then execute_model(scheduler_output)
SHUTDOWN = "shutdown"
OFFLOAD = "offload"  # keep a CPU tier of num_slots blocks of this rank's heads
RPC = "rpc"  # collective_rpc: `rpc` on every rank's runner, results gathered on rank 0


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
    lora_config: LoRAConfig | None = None  # enable_lora: every rank adapts its shard


@dataclass(slots=True)
class Command:
    kind: str
    spec: WorkerSpec | None = None  # INIT
    num_blocks: int = 0  # INIT_KV; OFFLOAD: the tier's slots
    scheduler_output: SchedulerOutput | None = None  # EXECUTE
    # EXECUTE: the tokens rank 0 sampled in the previous step (req_id -> tokens: several when
    # drafts were accepted), which the workers append before running this one (their copies
    # of the requests stay rank 0's).
    sampled: dict[str, list[int]] = field(default_factory=dict)
    # EXECUTE: the offload tier's saves since the last step, (block ids, slots) each: the
    # workers copy the same blocks of their heads before this step writes any block.
    kv_saves: list[tuple[list[int], list[int]]] = field(default_factory=list)
    # EXECUTE: LoRA ids rank 0's add_lora found loaded since the last command (LRU order),
    # which the workers' managers repeat first (LoRAManager.touched).
    lora_touched: list[int] = field(default_factory=list)
    # RPC: (method name or picklable callable taking the runner first, args, kwargs).
    rpc: tuple[object, tuple[Any, ...], dict[str, Any]] | None = None


def broadcast_command(tp: TPGroup, command: Command | None,
                      timeout_s: float | None = None) -> Command:
    """Rank 0 passes the command; every other rank passes None and gets it back.

    broadcast_object_list's own steps (a pickled byte tensor after its length), done here so
    that rank 0 waits at most the group's timeout: a broadcast root blocks until every receiver
    has taken the data, and a hung worker must not hang the engine. Workers wait as long as the
    engine stays idle (the command group's long timeout). timeout_s: rank 0's wait, when not
    the group's timeout."""
    wait_s = timeout_s if timeout_s is not None else tp.timeout_s
    timeout = timedelta(seconds=wait_s) if tp.is_driver else None
    try:
        payload = pickle.dumps(command) if tp.is_driver else b""
        size = torch.tensor([len(payload)], dtype=torch.int64)
        _broadcast(size, tp, timeout)
        data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if tp.is_driver
                else torch.empty(int(size.item()), dtype=torch.uint8))
        _broadcast(data, tp, timeout)
    except RuntimeError as e:
        raise CollectiveError(f"rank {tp.rank}: command broadcast over {tp.world_size} ranks "
                              f"failed (timeout {wait_s:g}s): {e}") from e
    if tp.is_driver:
        assert command is not None
        return command
    received = pickle.loads(data.numpy().tobytes())
    if not isinstance(received, Command):
        raise CollectiveError(f"rank {tp.rank}: expected a Command from rank 0, got "
                              f"{type(received).__name__}")
    return received


def _broadcast(tensor: torch.Tensor, tp: TPGroup, timeout: timedelta | None) -> None:
    work = dist.broadcast(tensor, src=0, group=tp.command_group, async_op=True)
    assert work is not None
    if timeout is None:
        work.wait()
    else:
        work.wait(timeout=timeout)


def run_rpc(runner: object, rpc: tuple[object, tuple[Any, ...], dict[str, Any]]
            ) -> tuple[bool, object]:
    """(True, result) or (False, "ErrorType: message"): a failing call must not end a worker."""
    from strand.engine_core.engine_extras import collective_rpc

    method, args, kwargs = rpc
    if not (isinstance(method, str) or callable(method)):
        return False, f"TypeError: method must be a name or a callable, got {method!r}"
    try:
        return True, collective_rpc([runner], method, args, kwargs)[0]
    except Exception as e:  # noqa: BLE001 (reported to rank 0, which raises it)
        return False, f"{type(e).__name__}: {e}"


def gather_rpc_results(tp: TPGroup, mine: tuple[bool, object]) -> list[tuple[bool, object]]:
    """Every rank's run_rpc result, in rank order, on rank 0 ([] elsewhere)."""
    out: list[object] | None = [None] * tp.world_size if tp.is_driver else None
    try:
        dist.gather_object(mine, out, dst=0, group=tp.command_group)
    except RuntimeError as e:
        raise CollectiveError(f"rank {tp.rank}: gathering collective_rpc results failed: {e}"
                              ) from e
    return [r for r in out if isinstance(r, tuple)] if out is not None else []
