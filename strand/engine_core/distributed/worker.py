"""A worker rank (1..N-1): joins the group, builds its shard of the model runner from rank 0's
spec, then runs whatever rank 0 broadcasts until told to stop.

Local workers are spawned by the engine (driver.py); on another node `strand worker` starts
this node's ranks (serve_node) with the same distributed flags as the engine.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import sys
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

import torch
import torch.distributed as dist

from strand import envs
from strand.engine_core.connector.cpu_tier import CPUBlockTier
from strand.engine_core.connector.offload import OffloadMetadata
from strand.engine_core.distributed import commands
from strand.engine_core.distributed.commands import Command, broadcast_command
from strand.engine_core.distributed.parallel_state import (
    DistributedInit,
    TPGroup,
    destroy_tp_group,
    init_tp_group,
)
from strand.engine_core.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def run_worker(init: DistributedInit, rank: int) -> None:
    """The body of one worker process; returns when rank 0 says shutdown."""
    # The services' log-level variable (strand/services/common/errors.py), as in the engine process.
    logging.basicConfig(level=envs.log_level() or "WARNING",
                        format=f"%(asctime)s rank{rank} %(name)s: %(message)s")
    tp = init_tp_group(init, rank)
    try:
        first = broadcast_command(tp, None)
        if first.kind != commands.INIT or first.spec is None:
            raise RuntimeError(f"rank {rank}: the first command must be init, got {first.kind}")
        runner = _build_runner(first.spec, tp)
        while _serve_one(runner, tp, broadcast_command(tp, None)):
            pass
    finally:
        destroy_tp_group()


def _build_runner(spec: commands.WorkerSpec, tp: TPGroup) -> ModelRunner:
    if spec.cpu_threads is not None:
        torch.set_num_threads(spec.cpu_threads)
    device = f"cuda:{tp.local_rank}" if spec.device.startswith("cuda") else spec.device
    return ModelRunner(spec.model_config, spec.cache_config, spec.scheduler_config,
                       device=device, attention_backend=spec.attention_backend, seed=spec.seed,
                       tp=tp, lora_config=spec.lora_config)


def _serve_one(runner: ModelRunner, tp: TPGroup, command: Command) -> bool:
    """Run one command; False when it was shutdown."""
    if command.kind == commands.EXECUTE and command.scheduler_output is not None:
        runner.apply_sampled(command.sampled)
        if runner.lora_manager is not None:
            runner.lora_manager.touch(command.lora_touched)
        _repeat_offload(runner, command)
        runner.execute_model(command.scheduler_output)
    elif command.kind == commands.OFFLOAD:
        c = runner.kv_config
        runner.offload_tier = CPUBlockTier(command.num_blocks, c.num_layers, runner.block_size,
                                           c.num_kv_heads, c.head_dim, c.dtype,
                                           pin_memory=runner.device.type == "cuda")
    elif command.kind == commands.NUM_BLOCKS:
        agree_num_blocks(tp, runner.determine_num_blocks())
    elif command.kind == commands.INIT_KV:
        runner.initialize_kv_cache(command.num_blocks)
    elif command.kind == commands.RPC and command.rpc is not None:
        commands.gather_rpc_results(tp, commands.run_rpc(runner, command.rpc))
    elif command.kind == commands.SHUTDOWN:
        return False
    else:
        raise RuntimeError(f"rank {tp.rank}: unknown command {command.kind!r}")
    return True


def _repeat_offload(runner: ModelRunner, command: Command) -> None:
    """Rank 0's tier copies, on this rank's heads: its saves, then the step's loads."""
    tier = runner.offload_tier
    if tier is None:
        return
    for block_ids, slots in command.kv_saves:
        tier.copy_out(block_ids, slots, runner.kv_caches)
    meta = command.scheduler_output.kv_connector_metadata if command.scheduler_output else None
    if isinstance(meta, OffloadMetadata) and meta.slots:
        tier.copy_in(meta.slots, meta.block_ids, runner.kv_caches)


def agree_num_blocks(tp: TPGroup, num_blocks: int) -> int:
    """The smallest count over ranks: the one block table must fit every rank's cache."""
    count = torch.tensor([num_blocks], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        count = count.cuda(tp.local_rank)
    tp.all_reduce_min(count)
    return int(count.item())


def _worker_entry(init: DistributedInit, rank: int) -> None:
    try:
        run_worker(init, rank)
    except BaseException as e:  # noqa: BLE001 (the exit code is what rank 0 sees)
        logger.error("rank %d: %s", rank, e)
        print(f"strand worker rank {rank} failed: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


def spawn_workers(init: DistributedInit, ranks: list[int]) -> list[BaseProcess]:
    """One process per rank, never forked from the engine (its OpenMP and CUDA state must not
    be inherited): from a fork server that imported this module once (the second engine of a
    process starts its workers in a fraction of a second), else spawned."""
    ctx: BaseContext
    if "forkserver" in mp.get_all_start_methods():
        server = mp.get_context("forkserver")
        server.set_forkserver_preload([__name__])
        ctx = server
    else:
        ctx = mp.get_context("spawn")
    procs: list[BaseProcess] = []
    for rank in ranks:
        proc = ctx.Process(target=_worker_entry, args=(init, rank), daemon=True,
                           name=f"strand-tp-rank{rank}")
        proc.start()
        procs.append(proc)
    return procs


def serve_node(init: DistributedInit) -> int:
    """`strand worker`: run this node's ranks until rank 0 shuts them down; the exit code."""
    if init.node_rank == 0:
        raise ValueError("node_rank must be >= 1 for `strand worker` (node 0 runs the engine)")
    procs = spawn_workers(init, list(init.node_ranks()))
    for proc in procs:
        proc.join()
    codes = [proc.exitcode or 0 for proc in procs]
    return max(codes, default=0)
