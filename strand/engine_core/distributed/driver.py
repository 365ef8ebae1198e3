"""Rank 0 of a tensor-parallel engine: the engine process's own model runner, which hands every
call to the worker ranks first (one broadcast) and then runs its own shard of it.

The scheduler stays one, in this process: the workers receive each step's SchedulerOutput, so the
block tables are identical on all ranks; each rank's paged cache holds its own KV heads. Only
rank 0 samples; the tokens it sampled travel with the next step's broadcast.

A rank that dies or stops answering turns the call into WorkerFailedError naming it (the
engine then ends its requests with finish_reason "error"), never a hang: every collective of a
step runs under the group's timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from strand.engine_core.config import CacheConfig, LoRAConfig, SchedulerConfig
from strand.engine_core.connector.cpu_tier import CPUBlockTier
from strand.engine_core.core.runner_output import ModelRunnerOutput
from strand.engine_core.core.sched_output import SchedulerOutput
from strand.engine_core.distributed import commands
from strand.engine_core.distributed.commands import Command, WorkerSpec, broadcast_command
from strand.engine_core.distributed.parallel_state import (
    CollectiveError,
    DistributedInit,
    destroy_tp_group,
    init_tp_group,
)
from strand.engine_core.distributed.worker import agree_num_blocks, spawn_workers
from strand.engine_core.errors import WorkerFailedError
from strand.engine_core.lora.manager import apply_mirrored
from strand.engine_core.model_executor.model_config import ModelConfig
from strand.engine_core.model_executor.model_runner import ModelRunner
from strand.platform.ports import free_ports

logger = logging.getLogger(__name__)
T = TypeVar("T")
JOIN_TIMEOUT_S = 10.0
DEATH_REPORT_S = 2.0
LOAD_TIMEOUT_S = 1800.0  # a worker loading its shard or profiling memory


def free_port(host: str) -> int:
    """A free port for the group's store on a single node, below the ephemeral range: the
    workers' own connections take ports from that range while the store is not yet bound."""
    return free_ports(host, 1)[0]


class TPDriverRunner(ModelRunner):
    def __init__(self, init: DistributedInit, model_config: ModelConfig,
                 cache_config: CacheConfig, scheduler_config: SchedulerConfig,
                 attention_backend: str | None = None, seed: int = 0,
                 cpu_threads: int | None = None, lora_config: LoRAConfig | None = None) -> None:
        if init.node_rank != 0:
            raise ValueError(f"node_rank must be 0 on the engine's node, got {init.node_rank}")
        self.failure: str | None = None
        self._sampled: dict[str, list[int]] = {}
        self._tier: CPUBlockTier | None = None  # the offload connector's, when configured
        # This node's other ranks (the other nodes' come from `strand worker`); under torchrun
        # every rank already has its process.
        self.procs: list[BaseProcess] = ([] if init.torchrun
                                         else spawn_workers(init, list(init.node_ranks())[1:]))
        try:
            tp = init_tp_group(init, 0)
        except CollectiveError:
            self._stop_procs()
            raise
        self._tp = tp
        spec = WorkerSpec(model_config, cache_config, scheduler_config,
                          "cuda" if init.backend == "nccl" else "cpu", attention_backend, seed,
                          cpu_threads, lora_config)
        self._call(Command(commands.INIT, spec=spec))
        try:
            super().__init__(model_config, cache_config, scheduler_config,
                             device="cuda:0" if init.backend == "nccl" else "cpu",
                             attention_backend=attention_backend, seed=seed, tp=tp,
                             lora_config=lora_config)
        except BaseException:
            self.shutdown()
            raise
        if self.lora_manager is not None:
            self.lora_manager.mirror = self._mirror_lora

    # ---- the calls every rank makes --------------------------------------------------------

    def determine_num_blocks(self) -> int:
        self._call(Command(commands.NUM_BLOCKS))
        return self._guard(lambda: agree_num_blocks(self._tp, super(
            TPDriverRunner, self).determine_num_blocks()))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self._call(Command(commands.INIT_KV, num_blocks=num_blocks))
        self._guard(lambda: super(TPDriverRunner, self).initialize_kv_cache(num_blocks))

    def attach_offload_tier(self, tier: CPUBlockTier) -> None:
        """The offload connector's tier (rank 0's heads): the workers get one of as many slots
        for theirs, and repeat each of its copies."""
        self._call(Command(commands.OFFLOAD, num_blocks=tier.num_slots))
        tier.journal = []
        self._tier = tier

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        saves: list[tuple[list[int], list[int]]] = []
        if self._tier is not None and self._tier.journal:
            saves, self._tier.journal = self._tier.journal, []
        touched = [] if self.lora_manager is None else self.lora_manager.take_touched()
        self._call(Command(commands.EXECUTE, scheduler_output=scheduler_output,
                           sampled=self._sampled, kv_saves=saves, lora_touched=touched))
        out = self._guard(lambda: super(TPDriverRunner, self).execute_model(scheduler_output))
        self._sampled = {req_id: tokens for req_id, tokens
                         in zip(out.req_ids, out.sampled_token_ids, strict=True) if tokens}
        return out

    def collective_rpc(self, method: str | Callable[..., Any], args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        """`method` on every rank's runner (a name, or a picklable callable taking the runner
        first), one result per rank in rank order; ValueError naming the ranks that failed."""
        rpc = (method, args, kwargs or {})
        self._call(Command(commands.RPC, rpc=rpc))
        mine = commands.run_rpc(self, rpc)
        results = self._guard(lambda: commands.gather_rpc_results(self._tp, mine))
        failed = _failures(results)
        if failed:
            raise ValueError("collective_rpc failed on " + failed)
        return [value for _, value in results]

    def _mirror_lora(self, method: str, args: tuple[object, ...]) -> None:
        """The LoRA manager's add / remove / pin, done on rank 0 already, on the workers (one
        collective_rpc broadcast: the adapter directory is read by every rank, on its node)."""
        assert self.lora_manager is not None
        touched = self.lora_manager.take_touched()
        rpc: tuple[object, tuple[Any, ...], dict[str, Any]] = (
            apply_mirrored, (touched, method, args), {})
        self._call(Command(commands.RPC, rpc=rpc))
        results = self._guard(lambda: commands.gather_rpc_results(self._tp, (True, None)))
        failed = _failures(results)
        if failed:
            raise ValueError(f"{method} failed on " + failed)

    def take_comm_time(self) -> float:
        """Seconds this rank spent in the layers' collectives since the last call."""
        return self._tp.take_comm_time()

    def shutdown(self) -> None:
        """Tell the workers to exit, wait for them (then end them), leave the group."""
        if self.failure is None:
            try:
                self._call(Command(commands.SHUTDOWN))
            except WorkerFailedError:
                pass
        self._stop_procs()
        self.failure = self.failure or "the engine was shut down"
        destroy_tp_group()

    # ---- failure ---------------------------------------------------------------------------

    def _call(self, command: Command) -> None:
        self._check_alive()
        # A step's workers are ready within the step's timeout; before the first one they may
        # still be loading their shard (minutes for a large model), which is not a hang.
        wait_s = None if command.kind == commands.EXECUTE else max(self._tp.timeout_s,
                                                                   LOAD_TIMEOUT_S)
        self._guard(lambda: broadcast_command(self._tp, command, wait_s))

    def _guard(self, call: Callable[[], T]) -> T:
        if self.failure is not None:
            raise WorkerFailedError(self.failure)
        try:
            return call()
        except CollectiveError as e:
            self._fail(str(e))
            raise AssertionError("unreachable") from e

    def _check_alive(self) -> None:
        if self.failure is not None:
            raise WorkerFailedError(self.failure)
        dead = [p for p in self.procs if not p.is_alive()]
        if dead:
            self._fail("found dead before the step was sent")

    def _fail(self, detail: str) -> None:
        # A killed worker breaks the collective at once, but its exit may take a moment to be
        # reported (fork-server children are not ours to wait on): give it that moment.
        deadline = time.monotonic() + DEATH_REPORT_S
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        dead = [f"rank {i + 1} (exit code {p.exitcode})" for i, p in enumerate(self.procs)
                if not p.is_alive()]
        who = ", ".join(dead) if dead else "no local rank exited: a rank stopped answering"
        self.failure = (f"tensor-parallel worker failure: {who}; {detail}")
        logger.error("%s", self.failure)
        self._stop_procs()
        destroy_tp_group()
        raise WorkerFailedError(self.failure)

    def _stop_procs(self) -> None:
        for proc in self.procs:
            proc.join(timeout=JOIN_TIMEOUT_S if self.failure is None else 0.5)
            if proc.is_alive():
                # SIGKILL: a stopped or hung worker does not act on SIGTERM.
                proc.kill()
                proc.join(timeout=JOIN_TIMEOUT_S)


def _failures(results: list[tuple[bool, object]]) -> str:
    """'rank k: error; ...' for the ranks whose call failed ('' when none did)."""
    return "; ".join(f"rank {rank}: {value}" for rank, (ok, value) in enumerate(results)
                     if not ok)
