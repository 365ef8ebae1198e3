"""EngineCore: schedule -> execute -> update, and nothing else.

The process-local heart of the engine service: requests come in as EngineCoreRequest (already
tokenized), token ids go out as EngineCoreOutput (not yet detokenized).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from prometheus_client import CollectorRegistry

from strand.engine_core import engine_extras
from strand.engine_core.config import CacheConfig, EngineArgs, SchedulerConfig
from strand.engine_core.core import kv_control
from strand.engine_core.core.batch_queue import BatchQueue
from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from strand.engine_core.core.expiry import Expiry
from strand.engine_core.core.kv_events import KVEventBatch, KVEventBuffer
from strand.engine_core.core.request import Request, RequestStatus
from strand.engine_core.core.sched_output import SchedulerOutput
from strand.engine_core.core.scheduler import Scheduler
from strand.engine_core.core.tier_reset import TierReset
from strand.engine_core.default_model import gguf_file, resolve_model_dir
from strand.engine_core.errors import DuplicateRequestError, QueueFullError, WorkerFailedError
from strand.engine_core.lora.manager import LoRAManager
from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.metrics.engine_metrics import EngineMetrics
from strand.engine_core.model_executor.model_config import (
    ModelConfig,
    dtype_name,
    load_model_config,
)
from strand.engine_core.model_executor.model_runner import ModelRunner
from strand.engine_core.model_executor.seq_cls import score_token_ids
from strand.engine_core.pooling.params import check_runner_fits, pooler_for_model
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sleep_mode import EngineSleepingError, SleepState
from strand.engine_core.stats_logger import ThroughputMeter
from strand.platform.cpu_binding import TeamSpread, team_spread

if TYPE_CHECKING:
    import xgrammar as xg

    from strand.engine_core.structured_output.grammar import GrammarCache

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, args: EngineArgs, model_config: ModelConfig, runner: ModelRunner,
                 scheduler: Scheduler) -> None:
        self.args = args
        self.model_config = model_config
        self.runner = runner
        self.scheduler = scheduler
        self.max_model_len = scheduler.scheduler_config.max_model_len
        self.block_size = args.block_size
        self.num_blocks = scheduler.kv_cache_manager.block_pool.num_blocks
        self.kv_cache_dtype = runner.kv_config.dtype  # kv_cache_dtype resolved
        self.num_steps = 0
        self.throughput = ThroughputMeter()
        # Names this engine in KV cache control calls ("" also means this engine).
        self.instance_id = "engine-0"
        self.last_scheduler_output: SchedulerOutput | None = None  # the latest step's (spans)
        # The thread that loaded the model; stepping from another is slow on CPU (see step()).
        self._load_thread: int | None = threading.get_ident()
        # max_concurrent_batches > 1: schedule step N+1 while step N computes (vLLM's batch
        # queue). Off by default: on CPU the worker thread's own OpenMP team makes every
        # forward slower (see _warn_other_thread), which outweighs the overlap.
        self.batch_queue: BatchQueue | None = None
        self.expiry = Expiry(args.max_queue_time)
        # spread_team_after_idle's placement, and whether the last step left nothing to run.
        self._team_spread: TeamSpread | None = None
        self._idle = True
        if args.max_concurrent_batches > 1 and scheduler.kv_connector is not None:
            # The connector saves a request's blocks from the engine thread when it lets go of
            # them; with a batch in flight those blocks may not be written yet.
            raise ValueError("max_concurrent_batches must be 1 with a KV connector "
                             f"({args.kv_connector!r}), got {args.max_concurrent_batches}")
        if args.max_concurrent_batches > 1:
            self.batch_queue = BatchQueue(args.max_concurrent_batches, runner.execute_model)
        # KV events: the block pool records cache changes for take_kv_events (a router's feed).
        self.kv_events: KVEventBuffer | None = None
        self.profiler = engine_extras.TorchProfiler()
        self.sleep_state = SleepState()
        # Set when a tensor-parallel rank failed: the engine cannot step any more.
        self.failure: str | None = None
        if args.kv_events:
            self.kv_events = scheduler.kv_cache_manager.block_pool.enable_kv_events(
                args.block_size, args.kv_events_max_buffer)
        # This engine's Prometheus metrics (LLMEngine adds its requests' to the same registry;
        # the engine service serves it on /metrics). Per instance: many engines in one process.
        self.metrics_registry = CollectorRegistry()
        self.model_name = args.model or model_config.model_dir
        self.metrics = EngineMetrics(self.metrics_registry, self.model_name, scheduler,
                                     scheduler.scheduler_config.max_num_batched_tokens,
                                     cache_info=self._cache_info())

    def _cache_info(self) -> dict[str, str]:
        """cache_config_info's labels (vLLM's names, values as strings)."""
        args = self.args
        return {"block_size": str(args.block_size), "cache_dtype": args.kv_cache_dtype,
                "kv_cache_dtype_resolved": dtype_name(self.kv_cache_dtype),
                "enable_prefix_caching": str(args.enable_prefix_caching),
                "prefix_caching_hash_algo": args.prefix_caching_hash_algo,
                "num_gpu_blocks": str(self.num_blocks)}

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> EngineCore:
        model_dir = resolve_model_dir(args.model)
        model_config = load_model_config(model_dir, args.dtype, args.hf_overrides)
        if model_config.score_tokens:
            model_config.score_token_ids = score_token_ids(
                model_config.score_tokens,
                None if args.skip_tokenizer_init else (args.tokenizer or model_dir))
        if args.quantization == "gguf":
            source = gguf_file(args.model)
            if source is None:
                raise ValueError(f"quantization='gguf' needs a .gguf model file, got model="
                                 f"{args.model!r}")
            model_config.quantization, model_config.gguf_file = "gguf", source
        elif args.quantization is None and (source := gguf_file(args.model)) is not None:
            # vLLM reads a .gguf model's blocks whatever the flags; here that is opt-in (the
            # default is transformers' gguf_file= result, the HF oracle's), so say what it costs.
            logger.info("%s: every weight dequantized to %s at load, as transformers' gguf_file="
                        " does; --quantization gguf keeps the linear weights in their blocks, "
                        "as llama.cpp and vLLM read them (about the file's size in memory)",
                        os.path.basename(source), str(model_config.dtype).removeprefix("torch."))
        scheduler_config = args.scheduler_config(model_config.max_position_embeddings)
        scheduler_config.pooler = pooler_for_model(args.runner, args.pooler_config,
                                                   model_config)
        cache_config = args.cache_config()
        if args.cpu_threads is not None:
            # On the thread that will step (the pool is per process, its team per thread).
            torch.set_num_threads(args.cpu_threads)
        runner = _make_runner(args, model_config, cache_config, scheduler_config)
        if args.logits_processors:
            from strand.engine_core.model_executor.sampler import Sampler
            from strand.engine_core.model_executor.sampling.logits_processor import (
                build_logits_processors,
            )

            runner.sampler = Sampler(build_logits_processors(args.logits_processors, args,
                                                             runner.device))
        try:
            num_blocks = runner.determine_num_blocks()
            runner.initialize_kv_cache(num_blocks)
        except BaseException:
            runner.shutdown()  # tensor-parallel workers must not outlive a failed start
            raise
        connector = _make_connector(args, runner, num_blocks)
        scheduler = Scheduler(scheduler_config, cache_config, num_blocks, connector=connector)
        return cls(args, model_config, runner, scheduler)

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def add_request(self, request: EngineCoreRequest) -> None:
        """ValueError (nothing changes) for a duplicate id or a request that can never fit."""
        if self.failure is not None:
            raise WorkerFailedError(self.failure)
        if self.sleep_state.is_sleeping():
            raise EngineSleepingError("the engine is sleeping: call wake_up() before add_request")
        if not isinstance(request.request_id, str):
            raise ValueError("request_id must be a str, got "
                             f"{type(request.request_id).__name__}")
        if request.request_id in self.scheduler.requests:
            raise DuplicateRequestError(f"request_id {request.request_id!r} is already in use")
        check_runner_fits(request.pooling_params, self.args.runner)
        bad = [t for t in request.prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids must be in [0, {self.vocab_size}), got {bad[:8]}")
        request.sampling_params.validate_against_vocab(self.vocab_size)
        structured = request.sampling_params.structured_outputs
        if structured is not None:
            # Parsed now, so a bad spec is refused before it is added; compiled in the
            # background, and the runner waits for it only at the request's first sample.
            cache = self.grammar_cache()
            cache.compile_async(structured, cache.parse(structured))
        bound = self.args.max_waiting_requests
        if bound is not None and len(self.scheduler.waiting) >= bound:
            raise QueueFullError(f"the engine's waiting queue is full: {bound} requests are "
                                 f"waiting (max_waiting_requests); retry later")
        newly_loaded: int | None = None
        if request.lora_request is not None:
            # Loaded (and checked against the model) now: a bad adapter fails here, not in a step.
            manager = self._lora_manager("lora_request")
            if request.lora_request.lora_int_id not in manager.list_loras():
                newly_loaded = request.lora_request.lora_int_id
            manager.add_lora(request.lora_request)
        try:
            self._enqueue(request)
        except ValueError:
            if newly_loaded is not None:  # a refused request leaves no adapter behind
                self._lora_manager("lora_request").remove_lora(newly_loaded)
            raise

    def _enqueue(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request(
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            sampling_params=request.sampling_params,
            eos_token_id=request.eos_token_id,
            arrival_time=request.arrival_time,
            priority=request.priority,
            cache_salt=request.cache_salt,
            lora_request=request.lora_request,
            pooling_params=request.pooling_params,
            deadline=request.deadline,
        ))
        self.expiry.note(request.request_id, request.deadline)

    def grammar_cache(self) -> GrammarCache:
        """The structured-output compiler, built on first use from the engine's tokenizer."""
        cache = self.runner.grammars.cache
        if cache is None:
            if self.args.skip_tokenizer_init:
                raise ValueError("structured_outputs need a tokenizer, but skip_tokenizer_init "
                                 "is True (no tokenizer is loaded)")
            from strand.engine_core.structured_output.grammar import GrammarCache, tokenizer_info

            tokenizer_dir = self.args.tokenizer or self.model_config.model_dir
            vocab_size, first_eos = self.vocab_size, self.model_config.first_eos_token_id

            def make_info() -> xg.TokenizerInfo:  # on the compile thread: ~1 s on 150k tokens
                tokenizer = Tokenizer.from_dir(tokenizer_dir)
                eos = tokenizer.eos_token_id
                return tokenizer_info(tokenizer, vocab_size,
                                      first_eos if eos is None else eos)

            cache = GrammarCache(make_info,
                                 max_entries=self.args.structured_outputs_cache_size)
            self.runner.grammars.cache = cache
        return cache

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        self.scheduler.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)

    def step(self) -> EngineCoreOutputs:
        if self.batch_queue is not None:
            return self.step_with_batch_queue()
        if not self.scheduler.has_requests():
            return EngineCoreOutputs(outputs=[])
        if self._load_thread is not None and threading.get_ident() != self._load_thread:
            self._warn_other_thread()
        dropped = self._drop_expired()
        flush_only = not self.scheduler.has_unfinished_requests()
        scheduler_output = self.scheduler.schedule()
        if not flush_only:  # a step that only hands finished ids to the runner ran no batch
            self.last_scheduler_output = scheduler_output
        spread = self._team_spread if self._idle and not flush_only else None
        try:
            with spread or nullcontext():
                runner_output = self.runner.execute_model(scheduler_output)
        except WorkerFailedError as e:
            return self._fail_all(str(e))
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        self._idle = not self.scheduler.has_unfinished_requests()
        return self._finish_step(dropped + outputs, None if flush_only else scheduler_output)

    def _drop_expired(self) -> list[EngineCoreOutput]:
        """Abort, before scheduling, the requests past their deadline or queued longer than
        max_queue_time (expiry.py); their outputs say so (finish_reason "abort", the reason in
        stop_reason), since no caller's abort told the rest of the ring."""
        expired = self.expiry.due(self.scheduler.requests, self.scheduler.waiting, time.time())
        if not expired:
            return []
        self.scheduler.finish_requests([rid for rid, _ in expired],
                                       RequestStatus.FINISHED_ABORTED)
        return [EngineCoreOutput(request_id=rid, new_token_ids=[], finish_reason="abort",
                                 stop_reason=reason) for rid, reason in expired]

    def _fail_all(self, reason: str) -> EngineCoreOutputs:
        """A rank is gone: every request the scheduler holds ends with finish_reason "error"."""
        self.failure = reason
        ids = list(self.scheduler.requests)
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ERROR)
        logger.error("ending %d request(s) with an error: %s", len(ids), reason)
        return self._finish_step([EngineCoreOutput(request_id=i, new_token_ids=[],
                                                   finish_reason="error") for i in ids], None)

    def is_healthy(self) -> bool:
        """False once a tensor-parallel rank failed (health checks report not serving)."""
        return self.failure is None

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (no-op with one rank)."""
        self.runner.shutdown()

    def spread_team_after_idle(self) -> bool:
        """On CPU, bind the team of OpenMP threads that runs the forward one thread per CPU for
        the first step after the engine was idle (cpu_binding.py says why). Call it on the thread
        that steps, once the model is loaded; the engine's own threads only (the engine stage,
        AsyncLLM), since the calling thread is bound for those steps. Whether it took effect (not
        with a batch queue, whose worker runs the forward)."""
        if self.runner.device.type != "cpu" or self.batch_queue is not None:
            return False
        self._team_spread = team_spread()
        return self._team_spread is not None

    def step_with_batch_queue(self) -> EngineCoreOutputs:
        """Schedule and queue a batch; while the queue has room and work was scheduled, return
        at once (no outputs), else wait for the oldest batch and apply its result."""
        queue = self.batch_queue
        assert queue is not None
        # As an abort between steps: the next batch scheduled carries their ids to the runner.
        dropped = self._drop_expired()
        if self.scheduler.has_requests():
            scheduler_output = self.scheduler.schedule()
            computes = scheduler_output.total_num_scheduled_tokens > 0
            # An empty batch still carries finished / preempted ids for the runner.
            if computes or scheduler_output.finished_req_ids or \
                    scheduler_output.preempted_req_ids or not len(queue):
                self.last_scheduler_output = scheduler_output
                queue.submit(scheduler_output)
            if computes and not queue.full:
                return self._only_dropped(dropped)
        if not len(queue):
            return self._only_dropped(dropped)
        scheduler_output, runner_output = queue.pop_oldest()
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        return self._finish_step(dropped + outputs, scheduler_output)

    @staticmethod
    def _only_dropped(dropped: list[EngineCoreOutput]) -> EngineCoreOutputs:
        """A batch-queue step that applied no batch: only the expired requests' endings."""
        return EngineCoreOutputs(outputs=dropped, finished_requests={o.request_id for o in dropped},
                                 timestamp=time.time())

    def _finish_step(self, outputs: list[EngineCoreOutput],
                     scheduler_output: SchedulerOutput | None) -> EngineCoreOutputs:
        """scheduler_output: the batch these outputs came from (None: nothing computed)."""
        self.num_steps += 1
        self.throughput.add(sum(len(o.new_token_ids) for o in outputs))
        self.metrics.observe_step(self.scheduler.make_stats(), scheduler_output, outputs)
        finished = {o.request_id for o in outputs if o.finished}
        return EngineCoreOutputs(outputs=outputs, finished_requests=finished,
                                 timestamp=time.time())

    def _warn_other_thread(self) -> None:
        self._load_thread = None  # once
        if self.runner.device.type == "cpu":
            # libgomp keeps an OpenMP team per thread that starts parallel work; with more
            # threads than CPUs it stops spin-waiting, and every GEMM then sleeps and wakes its
            # workers (12% slower steps on 2 cores, measured in the engine service).
            logger.warning("the engine is stepped on a thread other than the one that loaded "
                           "its model: on CPU each of them keeps its own OpenMP threads, which "
                           "makes every step slower; build the engine on the thread that "
                           "steps it")

    def has_unfinished_requests(self) -> bool:
        # A batch still in flight has results to deliver even if its requests were aborted.
        return self.scheduler.has_unfinished_requests() or bool(self.batch_queue)

    def take_kv_events(self) -> KVEventBatch | None:
        """The KV events since the last call as one numbered batch; None when there are none.

        Raises ValueError when the engine was built without kv_events=True.
        """
        if self.kv_events is None:
            raise ValueError("kv_events must be True (--kv-events) to take KV events")
        return self.kv_events.take()

    def kv_events_snapshot(self) -> tuple[list[bytes], int]:
        """Every block hash the prefix cache holds now and the seq of the next batch: a new
        subscriber's starting point (take pending events first, or they are counted twice).

        Raises ValueError when the engine was built without kv_events=True.
        """
        if self.kv_events is None:
            raise ValueError("kv_events must be True (--kv-events) to take KV events")
        pool = self.scheduler.kv_cache_manager.block_pool
        return pool.cached_block_hash_to_block.hashes(), self.kv_events.next_seq

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    def decodes_only(self) -> bool:
        """Whether the next step, as things stand, only decodes (Scheduler.decodes_only)."""
        return self.scheduler.decodes_only()

    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool:
        return self.scheduler.reset_prefix_cache(reset_running_requests, reset_connector)

    def reset_prefix_cache_tiers(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> list[TierReset]:
        """reset_prefix_cache with what each tier (device, connector tiers) dropped."""
        return self.scheduler.reset_prefix_cache_tiers(reset_running_requests, reset_connector)

    def clear_kv_cache(self, instance_id: str, location: str) -> tuple[str, int]:
        """Empty one KV location ("device" or "cpu"): (event id, number of tokens cleared)."""
        if instance_id not in ("", self.instance_id):
            raise ValueError(f"instance_id must be {self.instance_id!r} (or empty for this "
                             f"engine), got {instance_id!r}")
        kv_control.check_location(location)
        num_tokens = kv_control.clear_location(self.scheduler, location)
        event_id = kv_control.new_event_id()
        logger.info("KV cache clear %s: %s, %d tokens", event_id, location, num_tokens)
        return event_id, num_tokens

    def lookup_kv_cache(self, token_ids: list[int]) -> dict[str, int]:
        """Per location ("device", "cpu"): how many leading tokens of token_ids are cached."""
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token_ids must be ints in [0, {self.vocab_size}), got {bad[:8]}")
        return kv_control.lookup_locations(self.scheduler, token_ids)

    def _lora_manager(self, what: str) -> LoRAManager:
        manager = self.runner.lora_manager
        if manager is None:
            raise ValueError(f"{what} needs enable_lora=True (--enable-lora)")
        return manager

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load a PEFT adapter ahead of its requests; ValueError for one that cannot apply."""
        return self._lora_manager("add_lora").add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        """Unload it; False when it was not loaded. Requests still using it reload it."""
        return self._lora_manager("remove_lora").remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        return self._lora_manager("list_loras").list_loras()

    def pin_lora(self, lora_id: int) -> bool:
        """Never unload it to make room (max_cpu_loras); ValueError when it is not loaded."""
        return self._lora_manager("pin_lora").pin_lora(lora_id)

    def workers(self) -> list[object]:
        """The model workers collective_rpc reaches (one runner today; TP adds more)."""
        return [self.runner]

    def get_supported_tasks(self) -> tuple[str, ...]:
        """vLLM's: what the runner and model do; a reranker (one label) also scores."""
        pooler = self.scheduler.pooler
        if pooler is None:
            return ("generate",)
        if not pooler.num_labels:
            return ("embed",)
        return ("classify", "score") if pooler.num_labels == 1 else ("classify",)

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None,
                       args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
                       ) -> list[Any]:
        """One result per worker (per tensor-parallel rank, in rank order); timeout is accepted
        for vLLM's API (the collectives' own timeout applies)."""
        collective = getattr(self.runner, "collective_rpc", None)
        if collective is not None:  # tensor parallel: the other ranks are other processes
            return list(collective(method, args, kwargs))
        return engine_extras.collective_rpc(self.workers(), method, args, kwargs)

    def sleep(self, level: int = 1) -> None:
        """Free device memory: level 1 offloads weights, level 2 drops them; both drop KV."""
        if self.args.tensor_parallel_size > 1:
            raise ValueError("sleep needs tensor_parallel_size 1 (the worker ranks' memory is "
                             f"not released yet), got {self.args.tensor_parallel_size}")
        if self.has_unfinished_requests():
            raise ValueError("sleep needs an idle engine: "
                             f"{self.get_num_unfinished_requests()} requests are unfinished")
        self.sleep_state.sleep(self.runner, level)
        # The cached blocks' contents are gone with the KV tensors.
        self.scheduler.reset_prefix_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleep_state.wake_up(self.runner, self.num_blocks, tags)

    def is_sleeping(self) -> bool:
        return self.sleep_state.is_sleeping()

    def start_profile(self) -> None:
        self.profiler.start()

    def stop_profile(self) -> str:
        return self.profiler.stop()

    def get_stats(self) -> dict[str, float]:
        stats = self.scheduler.make_stats()
        result = {
            "num_running_reqs": float(stats.num_running_reqs),
            "num_waiting_reqs": float(stats.num_waiting_reqs),
            "kv_cache_usage": float(stats.kv_cache_usage),
            "prefix_cache_hit_rate": float(stats.prefix_cache_stats.hit_rate),
            "prefix_cache_recent_hit_rate": float(stats.prefix_cache_recent_hit_rate),
            "num_steps": float(self.num_steps),
            "generation_tokens_per_s": self.throughput.rate(),
        }
        external = stats.connector_prefix_cache_stats
        if external is not None:
            result["connector_prefix_cache_hit_rate"] = float(external.hit_rate)
        spec = stats.spec_decoding
        if spec is not None:  # totals since start: a logger diffs them per interval
            result["spec_decode_num_drafts"] = float(spec.num_drafts)
            result["spec_decode_num_draft_tokens"] = float(spec.num_draft_tokens)
            result["spec_decode_num_accepted_tokens"] = float(spec.num_accepted_tokens)
        return result


def _make_runner(args: EngineArgs, model_config: ModelConfig, cache_config: CacheConfig,
                 scheduler_config: SchedulerConfig) -> ModelRunner:
    if args.tensor_parallel_size == 1:
        return ModelRunner(model_config, cache_config, scheduler_config, device=args.device,
                           attention_backend=args.attention_backend, seed=args.seed,
                           enforce_eager=args.enforce_eager, lora_config=args.lora_config())
    from strand.engine_core.distributed.driver import TPDriverRunner, free_port
    from strand.engine_core.distributed.layers import shard_layout
    from strand.engine_core.distributed.parallel_state import (
        DistributedInit,
        torchrun_init,
        torchrun_rank,
    )
    from strand.engine_core.model_executor.loader import resolve_device

    # A model that cannot be split is refused here, before any rank is started (every rank
    # would refuse it the same way while loading, and rank 0 would wait on them to exit).
    shard_layout(model_config, 0, args.tensor_parallel_size)
    device = resolve_device(args.device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    per_node = args.tensor_parallel_size // args.nnodes
    if device.type == "cuda" and per_node > torch.cuda.device_count():
        raise ValueError(f"tensor_parallel_size / nnodes ({per_node}) must be <= the GPUs on "
                         f"this node ({torch.cuda.device_count()}): one GPU per rank")
    rank = torchrun_rank()
    if rank is not None:
        init = torchrun_init(args.tensor_parallel_size, backend, args.distributed_timeout_s)
        if rank != 0:
            # torchrun runs one script on every rank: past rank 0, this process is a worker.
            # It serves rank 0 until the engine shuts down, then exits (as a worker would).
            from strand.engine_core.distributed.worker import run_worker

            run_worker(init, rank)
            raise SystemExit(0)
        return TPDriverRunner(init, model_config, cache_config, scheduler_config,
                              attention_backend=args.attention_backend, seed=args.seed,
                              cpu_threads=args.cpu_threads, lora_config=args.lora_config())
    init = DistributedInit(
        world_size=args.tensor_parallel_size, master_addr=args.master_addr,
        master_port=args.master_port or free_port(args.master_addr), nnodes=args.nnodes,
        node_rank=args.node_rank, backend=backend,
        timeout_s=args.distributed_timeout_s)
    return TPDriverRunner(init, model_config, cache_config, scheduler_config,
                          attention_backend=args.attention_backend, seed=args.seed,
                          cpu_threads=args.cpu_threads, lora_config=args.lora_config())


def _make_connector(args: EngineArgs, runner: ModelRunner, num_blocks: int) -> object | None:
    if not args.kv_connector:
        return None
    from strand.engine_core.connector.factory import create_connector

    return create_connector(args, runner, num_blocks)
