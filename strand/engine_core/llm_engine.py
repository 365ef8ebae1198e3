"""LLMEngine: input processor + engine core + output processor in one process (vLLM's API)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from strand.engine_core.config import EngineArgs
from strand.engine_core.config_checks import check_engine_args, logits_processor_classes
from strand.engine_core.core.engine import EngineCore
from strand.engine_core.default_model import resolve_model_dir
from strand.engine_core.errors import DuplicateRequestError
from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.metrics import Metric, snapshot
from strand.engine_core.metrics.request_metrics import RequestStatsRecorder
from strand.engine_core.outputs import PoolingRequestOutput, RequestOutput
from strand.engine_core.pooling.params import PoolingParams
from strand.engine_core.processing.input_processor import InputProcessor
from strand.engine_core.processing.output_processor import OutputProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams
from strand.engine_core.stats_logger import StatsLogger

logger = logging.getLogger(__name__)

PromptType = str | dict[str, Any]


def _tokenizer_before_the_model(args: EngineArgs) -> Tokenizer | None:
    """The tokenizer, loaded before the model where its directory has one: the temporaries of
    its load (tens of MB of parsed tokenizer.json for a 128k-token vocabulary) are then freed
    into the heap that the weights reuse, instead of coming on top of the loaded model and its
    KV cache at the process's peak. None where there is none to load yet (a model that cannot
    load then says so first, as it did; a missing tokenizer is named after it)."""
    if args.skip_tokenizer_init:
        return None
    tokenizer_dir = Path(args.tokenizer or resolve_model_dir(args.model))
    if not (tokenizer_dir / "tokenizer.json").is_file():
        return None
    return Tokenizer.from_dir(tokenizer_dir, chat_template=args.chat_template)


class LLMEngine:
    def __init__(self, args: EngineArgs, engine_core: EngineCore,
                 tokenizer: Tokenizer | None) -> None:
        """tokenizer None: skip_tokenizer_init (token-id prompts; EOS from the model's config)."""
        self.args = args
        self.engine_core = engine_core
        self.tokenizer = tokenizer
        eos = (tokenizer.eos_token_id if tokenizer is not None
               else engine_core.model_config.first_eos_token_id)
        self.input_processor = InputProcessor(tokenizer, engine_core.max_model_len,
                                              engine_core.vocab_size, eos_token_id=eos,
                                              max_logprobs=args.max_logprobs,
                                              logits_processor_classes=logits_processor_classes(args),
                                              reasoning_parser=args.reasoning_parser,
                                              default_template_kwargs=args.default_chat_template_kwargs,
                                              priority_scheduling=args.scheduling_policy == "priority",
                                              runner=args.runner)
        # Request metrics go to the core's registry: get_metrics() reads both from one place.
        request_stats = RequestStatsRecorder(engine_core.metrics_registry,
                                             engine_core.model_name, engine_core.max_model_len)
        self.output_processor = OutputProcessor(tokenizer, stream_interval=args.stream_interval,
                                                stats=request_stats)
        self.stats_logger = StatsLogger(args.stats_interval_s) if args.log_stats else None

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        check_engine_args(args)  # before the model loads
        tokenizer = _tokenizer_before_the_model(args)
        core = EngineCore.from_engine_args(args)
        if tokenizer is None and not args.skip_tokenizer_init:
            tokenizer = Tokenizer.from_dir(args.tokenizer or core.model_config.model_dir,
                                           chat_template=args.chat_template)
        return cls(args, core, tokenizer)

    def get_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError("Unable to get a tokenizer: skip_tokenizer_init is True")
        return self.tokenizer

    def add_request(self, request_id: str, prompt: PromptType,
                    params: SamplingParams | PoolingParams | None = None,
                    arrival_time: float | None = None, lora_request: LoRARequest | None = None,
                    priority: int = 0) -> None:
        """ValueError naming the field for bad input; the engine is then unchanged.

        lora_request: the adapter the request runs with (needs enable_lora); None: base model.
        params: a PoolingParams on an engine with runner="pooling" (None: its defaults); its
        one output is a PoolingRequestOutput with the prompt's embedding.
        """
        if not isinstance(request_id, str):
            raise ValueError(f"request_id must be a str, got {type(request_id).__name__}")
        if self.output_processor.has_request(request_id):
            raise DuplicateRequestError(f"request_id {request_id!r} is already in use")
        processed = self.input_processor.process(request_id, prompt, params, arrival_time,
                                                 priority, lora_request=lora_request)
        children = self.output_processor.add_request(processed)
        added: list[str] = []
        try:
            for child in children:
                self.engine_core.add_request(child)
                added.append(child.request_id)
        except Exception:
            # All or nothing: a child the core refused (bad input, a full queue) takes its
            # siblings back out.
            self.engine_core.abort_requests(added)
            self.output_processor.abort_requests([request_id], count_as_aborted=False)
            raise

    def step(self) -> list[RequestOutput | PoolingRequestOutput]:
        core_outputs = self.engine_core.step()
        if self.engine_core.failure is not None:
            # A tensor-parallel rank failed: the core ended every request; say why.
            return [*self.output_processor.finish_with_error(
                [o.request_id for o in core_outputs.outputs], self.engine_core.failure)]
        result = self.output_processor.process_outputs(core_outputs.outputs,
                                                        core_outputs.timestamp)
        if result.reqs_to_abort:
            # Stop strings end requests here; the core must stop computing them at once.
            self.engine_core.abort_requests(result.reqs_to_abort)
        if self.stats_logger is not None:
            self.stats_logger.record(self.get_stats(), core_outputs.outputs,
                                     self.engine_core.last_scheduler_output)
        if result.pooling_outputs:  # a pooling engine's: its requests' embeddings
            return [*result.request_outputs, *result.pooling_outputs]
        return result.request_outputs  # type: ignore[return-value]  # list is invariant

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        child_ids = self.output_processor.abort_requests(ids)
        self.engine_core.abort_requests(child_ids)

    def take_back_requests(self, request_ids: Iterable[str]) -> None:
        """Remove requests added but not yet stepped (a batch that is all or nothing failed
        part way): as abort_request, but not counted as aborted in the metrics."""
        child_ids = self.output_processor.abort_requests(list(request_ids),
                                                         count_as_aborted=False)
        self.engine_core.abort_requests(child_ids)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def is_healthy(self) -> bool:
        """False once a tensor-parallel rank failed."""
        return self.engine_core.is_healthy()

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (no-op with one rank)."""
        self.engine_core.shutdown()

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool:
        return self.engine_core.reset_prefix_cache(reset_running_requests, reset_connector)

    def clear_kv_cache(self, instance_id: str, location: str) -> tuple[str, int]:
        """Empty one KV location ("device" or "cpu"): (event id, number of tokens cleared)."""
        return self.engine_core.clear_kv_cache(instance_id, location)

    def lookup_kv_cache(self, token_ids: list[int]) -> dict[str, int]:
        """Per location ("device", "cpu"): how many leading tokens of token_ids are cached."""
        return self.engine_core.lookup_kv_cache(token_ids)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load a PEFT adapter directory ahead of its requests (vLLM's add_lora)."""
        return self.engine_core.add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self.engine_core.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        return self.engine_core.list_loras()

    def pin_lora(self, lora_id: int) -> bool:
        return self.engine_core.pin_lora(lora_id)

    def get_supported_tasks(self) -> tuple[str, ...]:
        return self.engine_core.get_supported_tasks()

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None,
                       args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
                       ) -> list[Any]:
        """Call `method` on every model worker: a list with one result per worker."""
        return self.engine_core.collective_rpc(method, timeout, args, kwargs)

    def apply_model(self, func: Callable[[torch.nn.Module], Any]) -> list[Any]:
        """func(model) on every worker's model, one result per worker."""
        return self.collective_rpc(lambda worker: func(worker.model))

    def sleep(self, level: int = 1) -> None:
        """Level 1: weights to CPU, KV cache freed; level 2: both freed (reloaded on wake)."""
        self.engine_core.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back "weights" and/or "kv_cache" (all when tags is None)."""
        self.engine_core.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.engine_core.is_sleeping()

    def start_profile(self) -> None:
        """torch.profiler on; the trace directory is $STRAND_TORCH_PROFILER_DIR."""
        self.engine_core.start_profile()

    def stop_profile(self) -> str:
        """torch.profiler off; returns the path of the Chrome trace written."""
        return self.engine_core.stop_profile()

    def get_stats(self) -> dict[str, float]:
        return self.engine_core.get_stats()

    def get_metrics(self) -> list[Metric]:
        """This engine's Prometheus metrics (`strand:*`, vLLM's names) as Counter, Gauge and
        Histogram objects (vLLM's LLMEngine.get_metrics())."""
        return snapshot(self.engine_core.metrics_registry)

    def do_log_stats(self) -> None:
        """Log the stats line now (tokens/s since the last line); nothing without log_stats."""
        if self.stats_logger is not None:
            self.stats_logger.log_now(self.get_stats())
