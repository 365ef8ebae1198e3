"""EngineArgs (vLLM's names) and the per-component configs derived from it."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

# Plain data only (tests/engine_core/test_config_imports.py): features import config, never
# the other way. Checks that need feature code run where the engine is built (config_checks.py).
from strand.engine_core.chat_config import (
    REASONING_PARSERS,
    chat_template_source,
    check_template_kwargs,
    think_tags,
)
from strand.engine_core.pooler_config import RUNNERS, PoolerConfig
from strand.engine_core.speculative_config import SpeculativeConfig

QUANTIZATIONS = (None, "gguf")
KV_CACHE_DTYPES = ("auto", "bfloat16")


@dataclass(slots=True)
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"  # "sha256" | "xxhash" (fast, non-cryptographic)
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    kv_cache_memory: int = 512 * 1024**2  # bytes of KV cache on CPU
    # "auto": the model's dtype; "bfloat16": half of float32's bytes under float32 weights.
    cache_dtype: str = "auto"


@dataclass(slots=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 2048
    long_prefill_token_threshold: int = 0  # 0: a prefill chunk may take the whole budget
    policy: str = "fcfs"  # "fcfs" | "priority"
    max_loras: int | None = None  # distinct LoRA adapters per step; None: LoRA off
    # Prompt-lookup drafts for running requests (EngineArgs.speculative_config); None: off.
    speculative: SpeculativeConfig | None = None
    # runner="pooling": every request is embedded, none generates (EngineArgs.pooler_config).
    pooler: PoolerConfig | None = None


@dataclass(slots=True)
class LoRAConfig:
    max_loras: int = 1  # adapters in one batch (device slots)
    max_lora_rank: int = 16  # largest adapter rank accepted (slots are sized for it)
    max_cpu_loras: int = 1  # adapters kept loaded (LRU beyond it, pinned ones excepted)


@dataclass(slots=True)
class EngineArgs:
    model: str | None = None  # a local HF directory; None builds a tiny model (demo only)
    tokenizer: str | None = None  # defaults to model
    # vLLM's: load no tokenizer. Prompts are token ids, outputs token ids with text "", and
    # what needs one (text prompts, stop strings, bad_words, structured outputs) is refused.
    skip_tokenizer_init: bool = False
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    # None: weights in dtype. "gguf" (vLLM's name): a .gguf model's Q8_0/Q4_0/Q4_1/K-quant linear
    # weights stay in their blocks and are read packed (the rest as with None).
    quantization: str | None = None
    # vLLM's name: what the paged KV cache holds. "auto": the model's dtype. "bfloat16": K and V
    # rounded to bfloat16 as they are written (half of float32's bytes: decode attention reads
    # half as much), computed in the model's dtype.
    kv_cache_dtype: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 0
    block_size: int = 16
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 256
    # Requests waiting to run beyond which add_request raises QueueFullError (the service's
    # RESOURCE_EXHAUSTED). None: no bound in process; the engine service uses 4 x max_num_seqs.
    max_waiting_requests: int | None = None
    # Seconds a request may wait before its first step; past it, it ends with finish_reason
    # "abort" (reason "queue_time"). None: no bound.
    max_queue_time: float | None = None
    max_model_len: int | None = None
    long_prefill_token_threshold: int = 0
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    kv_cache_memory: int = 512 * 1024**2
    scheduling_policy: str = "fcfs"
    attention_backend: str | None = None  # None: auto (flash-attn > triton on CUDA > torch)
    enforce_eager: bool = False
    cpu_threads: int | None = None  # None: torch's default, one per core
    tensor_parallel_size: int = 1
    # Where the ranks meet (torchrun's names). master_port 0: a free port, one node only.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    distributed_timeout_s: float = 60.0  # joining the group, and every collective of a step
    kv_connector: str | None = None
    kv_connector_config: dict[str, Any] = field(default_factory=dict)
    kv_offload_bytes: int = 0
    max_logprobs: int = 20
    stream_interval: int = 1  # streaming outputs every k tokens (and the first and last)
    # Batches in flight at once (vLLM's batch queue): 2 schedules step N+1 while N computes.
    max_concurrent_batches: int = 1
    # Custom logits processors (vLLM v1's LogitsProcessor): classes or "pkg.module:Class".
    logits_processors: list[Any] | None = None
    log_stats: bool = False
    stats_interval_s: float = 5.0
    otlp_traces_endpoint: str | None = None
    # KV cache events (BlockStored/BlockRemoved/AllBlocksCleared) for a prefix-aware router.
    kv_events: bool = False
    kv_events_max_buffer: int = 10_000
    # Compiled grammars kept for structured outputs (one per distinct schema/regex/...).
    structured_outputs_cache_size: int = 256
    # vLLM's --reasoning-parser (deepseek_r1, qwen3): a request's structured outputs constrain
    # only what follows the reasoning's closing tag (strand/engine_core/processing/reasoning.py).
    reasoning_parser: str | None = None
    # vLLM's --chat-template (a file, or the template itself): replaces the tokenizer's; and
    # --default-chat-template-kwargs: variables every chat request's template gets (a
    # request's chat_template_kwargs win), e.g. {"enable_thinking": false}.
    chat_template: str | None = None
    default_chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's speculative_config for prompt lookup: {"method": "ngram", "num_speculative_tokens":
    # k, "prompt_lookup_max": n, "prompt_lookup_min": m}. None: one token a step.
    speculative_config: dict[str, Any] | None = None
    # vLLM's --runner: "generate" continues prompts; "pooling" embeds them (LLM.embed,
    # /v1/embeddings) as pooler_config says: {"pooling_type": "LAST" | "MEAN" | "CLS",
    # "normalize": bool}, default the last token's final hidden state, L2-normalised.
    runner: str = "generate"
    pooler_config: dict[str, Any] | None = None
    # vLLM's hf_overrides: config.json fields replaced before the model is read, e.g. a causal
    # reranker (Qwen3-Reranker) served as a classifier: {"architectures":
    # ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], "method":
    # "from_2_way_softmax"} (model_executor/seq_cls.py).
    hf_overrides: dict[str, Any] | None = None
    # LoRA adapters (vLLM's flags): per-request LoRARequest, add_lora / remove_lora / pin_lora.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # None: max_loras

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size % 1 != 0:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "half", "float"):
            raise ValueError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got "
                             f"{self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            fp8 = " (fp8 caches are not supported)" if self.kv_cache_dtype.startswith("fp8") else ""
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                             f"{self.kv_cache_dtype!r}{fp8}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_waiting_requests is not None and self.max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be >= 1, got "
                             f"{self.max_waiting_requests}")
        if self.max_queue_time is not None and not self.max_queue_time > 0:
            raise ValueError(f"max_queue_time must be > 0 seconds, got {self.max_queue_time}")
        if self.max_concurrent_batches < 1:
            raise ValueError("max_concurrent_batches must be >= 1, got "
                             f"{self.max_concurrent_batches}")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be >= -1 (-1: no limit), got {self.max_logprobs}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {self.cpu_threads}")
        if self.structured_outputs_cache_size < 1:
            raise ValueError("structured_outputs_cache_size must be >= 1, got "
                             f"{self.structured_outputs_cache_size}")
        if self.reasoning_parser is not None:
            think_tags(self.reasoning_parser)
        if self.chat_template is not None:
            chat_template_source(self.chat_template)  # whether it parses: config_checks.py
        if self.default_chat_template_kwargs is not None:
            try:
                check_template_kwargs(self.default_chat_template_kwargs)
            except ValueError as exc:
                raise ValueError(f"default_{exc}") from None
        if self.speculative_config is not None:
            SpeculativeConfig.from_dict(self.speculative_config)
            if self.logits_processors:
                # A custom processor sees a batch of one row per request; drafts would hand it
                # several rows of a request, some of them after tokens it never saw.
                raise ValueError("speculative_config cannot be combined with logits_processors")
        self._check_runner()
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if self.enable_lora and self.max_concurrent_batches > 1:
            # add_lora / remove_lora on the engine thread would change adapter slots under a
            # batch the worker thread is computing.
            raise ValueError("max_concurrent_batches must be 1 with enable_lora, got "
                             f"{self.max_concurrent_batches}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras must be >= max_loras ({self.max_loras}), got "
                             f"{self.max_cpu_loras}")
        self._check_parallel()

    def _check_runner(self) -> None:
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {list(RUNNERS)}, got {self.runner!r}")
        if self.runner != "pooling":
            if self.pooler_config is not None:
                raise ValueError("pooler_config needs runner='pooling' (--runner pooling), got "
                                 f"runner={self.runner!r}")
            return
        pooler = PoolerConfig.from_dict(self.pooler_config)
        # An embedding is one forward over the prompt: nothing drafts, nothing samples.
        if self.speculative_config is not None:
            raise ValueError("speculative_config needs runner='generate': a pooling runner "
                             "generates no tokens")
        if self.logits_processors:
            raise ValueError("logits_processors need runner='generate': a pooling runner "
                             "computes no logits")
        if pooler.needs_every_row and self.kv_connector:
            raise ValueError(f"pooler_config.pooling_type {pooler.pooling_type} reads every "
                             "prompt position, which a KV connector's hits would skip: unset "
                             "kv_connector or pool LAST")

    def pooler(self) -> PoolerConfig | None:
        """The pooling runner's config; None for a generating engine."""
        return PoolerConfig.from_dict(self.pooler_config) if self.runner == "pooling" else None

    def _check_parallel(self) -> None:
        tp = self.tensor_parallel_size
        if tp < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tp}")
        if self.nnodes < 1 or tp % self.nnodes:
            raise ValueError(f"nnodes must be >= 1 and divide tensor_parallel_size ({tp}), "
                             f"got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if not 0 <= self.master_port < 65536:
            raise ValueError(f"master_port must be in [0, 65535], got {self.master_port}")
        if self.nnodes > 1 and self.master_port == 0:
            raise ValueError("master_port must be set (1..65535) when nnodes > 1: every node "
                             "must be told the same port")
        if self.distributed_timeout_s <= 0:
            raise ValueError(f"distributed_timeout_s must be > 0, got "
                             f"{self.distributed_timeout_s}")
        if tp > 1 and self.kv_connector not in (None, "", "offload", "OffloadConnector",
                                                "OffloadingConnector"):
            # Only the offload tier repeats its copies on the worker ranks.
            raise ValueError(f"kv_connector must be offload (or unset) with "
                             f"tensor_parallel_size > 1, got {self.kv_connector!r}")
        if tp > 1 and self.quantization == "gguf":
            # The packed blocks are not split across ranks; dequantized at load, a .gguf
            # model is split like any other.
            raise ValueError(f"quantization gguf needs tensor_parallel_size 1, got {tp} (leave "
                             f"quantization unset to split the dequantized weights)")
        if tp > 1 and self.max_concurrent_batches > 1:
            raise ValueError("max_concurrent_batches must be 1 with tensor_parallel_size > 1, "
                             f"got {self.max_concurrent_batches}")

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """One --flag per field (dashes for underscores), vLLM style."""
        defaults = EngineArgs()
        for f in dataclasses.fields(EngineArgs):
            flag = "--" + f.name.replace("_", "-")
            default = getattr(defaults, f.name)
            if isinstance(default, bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                    help=_HELP.get(f.name))
            elif f.name == "logits_processors":
                parser.add_argument(flag, nargs="*", default=None, help=_HELP.get(f.name))
            elif f.name in ("default_chat_template_kwargs", "speculative_config",
                            "pooler_config", "hf_overrides"):
                parser.add_argument(flag, type=json_object, default=None,
                                    help=_HELP.get(f.name))
            elif f.name == "kv_connector_config":
                parser.add_argument(flag, type=json_object, default={},
                                    help="JSON object passed to the KV connector")
            else:
                kind = _cli_type(f.type)
                parser.add_argument(flag, type=kind, default=default, help=_HELP.get(f.name),
                                    choices=_CHOICES.get(f.name))
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})

    def cache_config(self) -> CacheConfig:
        return CacheConfig(
            block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory=self.kv_cache_memory,
            cache_dtype=self.kv_cache_dtype,
        )

    def lora_config(self) -> LoRAConfig | None:
        """None unless enable_lora."""
        if not self.enable_lora:
            return None
        return LoRAConfig(max_loras=self.max_loras, max_lora_rank=self.max_lora_rank,
                          max_cpu_loras=self.max_cpu_loras or self.max_loras)

    def scheduler_config(self, model_max_len: int) -> SchedulerConfig:
        """max_model_len defaults to the model's; the token budget to at least max_model_len."""
        max_len = self.max_model_len or model_max_len
        if max_len > model_max_len:
            raise ValueError(
                f"max_model_len ({max_len}) must be <= the model's max_position_embeddings "
                f"({model_max_len})")
        budget = self.max_num_batched_tokens or max(2048, self.max_num_seqs)
        return SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=self.max_num_seqs,
            max_model_len=max_len,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            policy=self.scheduling_policy,
            max_loras=self.max_loras if self.enable_lora else None,
            speculative=(SpeculativeConfig.from_dict(self.speculative_config)
                         if self.speculative_config is not None else None),
            pooler=self.pooler(),
        )


_HELP = {
    "model": "local HF model directory (config.json, safetensors, tokenizer.json); "
             "omitted: a tiny random Llama built locally",
    "tokenizer": "tokenizer directory (default: the model's)",
    "skip_tokenizer_init": "load no tokenizer: prompts must be token ids and outputs carry "
                           "token ids only (text prompts, stop strings, bad_words and "
                           "structured outputs are refused)",
    "dtype": "auto (the checkpoint's), float32, bfloat16 or float16",
    "quantization": "gguf: keep a .gguf model's linear weights packed (Q8_0, Q4_0, Q4_1, Q5_0, "
                    "Q5_1, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS) and read them so; "
                    "default: dequantize to --dtype",
    "kv_cache_dtype": "what the KV cache holds: auto (the model's dtype) or bfloat16 (half of "
                      "float32's bytes; K/V rounded to bfloat16 as they are written)",
    "device": "auto (cuda when available), cpu or cuda",
    "block_size": "tokens per KV cache block",
    "enable_prefix_caching": "reuse cached KV blocks of shared prompt prefixes",
    "kv_events": "record KV cache events for a prefix-aware router (take_kv_events)",
    "kv_events_max_buffer": "most KV events kept between takes (oldest dropped)",
    "structured_outputs_cache_size": "compiled grammars kept for structured outputs (LRU)",
    "chat_template": "the chat template: a file, or the template itself (default: the "
                     "tokenizer's)",
    "default_chat_template_kwargs": "JSON object of template variables every chat request "
                                    "gets, e.g. '{\"enable_thinking\": false}' (a request's "
                                    "chat_template_kwargs win)",
    "speculative_config": "speculative decoding by prompt lookup, a JSON object as vLLM's: "
                          "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                          "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}'; each step "
                          "verifies up to num_speculative_tokens drafted tokens copied from "
                          "where the request's last tokens occurred before; "
                          "\"disable_by_batch_size\": N drafts nothing while more than N "
                          "requests run",
    "reasoning_parser": "a thinking model's <think> format: deepseek_r1 (DeepSeek R1 and its "
                        "distills, QwQ) or qwen3 (Qwen 3). Structured outputs constrain only what "
                        "follows the reasoning, and the OpenAI front answers the reasoning apart "
                        "from the content",
    "prefix_caching_hash_algo": "sha256 (default) or xxhash (fast, non-cryptographic)",
    "max_num_batched_tokens": "token budget of one step (default: max(2048, max_num_seqs))",
    "max_num_seqs": "most requests running at once",
    "max_waiting_requests": "most requests waiting to run; more are refused as queue full "
                            "(default: none in process, 4 x max_num_seqs in the engine service)",
    "max_queue_time": "seconds a request may wait before its first step; a request that "
                      "waited longer ends with finish_reason abort (RESOURCE_EXHAUSTED for a "
                      "gRPC Generate) instead of running late (default: no bound)",
    "max_model_len": "longest prompt + output (default: the model's max_position_embeddings)",
    "long_prefill_token_threshold": "largest prefill chunk of one request per step (0: no cap)",
    "gpu_memory_utilization": "CUDA: share of GPU memory for weights, activations and KV cache",
    "num_gpu_blocks_override": "exact number of KV cache blocks (overrides the memory budget)",
    "kv_cache_memory": "CPU: bytes of KV cache",
    "scheduling_policy": "fcfs or priority (lower value first)",
    "attention_backend": "torch, triton or flash_attn (default: the best available)",
    "enforce_eager": "run every step eagerly. Default on CUDA (triton or flash_attn "
                     "backend): pure-decode steps replay CUDA graphs captured at start-up for "
                     "batch sizes 1, 2, 4, 8, ... up to max_num_seqs, padded to the next size",
    "cpu_threads": "threads for CPU compute: torch's intra-op pool, which the C++ kernels "
                   "share (default: one per core)",
    "tensor_parallel_size": "ranks the model is split over (one process each, on torch."
                            "distributed: gloo on CPU, NCCL on CUDA)",
    "nnodes": "nodes the ranks span (torchrun's --nnodes); the others run `strand worker`",
    "node_rank": "this node's index (0: the engine's node)",
    "master_addr": "address of rank 0's rendezvous store (torchrun's --master-addr)",
    "master_port": "port of the rendezvous store (0: a free one, single node only)",
    "distributed_timeout_s": "seconds to wait for all ranks to join, and for each collective "
                             "of a step, before failing with an error naming the rank",
    "kv_connector": "KV connector: offload (CPU tier) or multi",
    "kv_offload_bytes": "bytes of the offload connector's CPU tier",
    "logits_processors": "custom logits processors, each 'package.module:Class' (vLLM v1's "
                         "LogitsProcessor interface; applied per request from extra_args)",
    "max_concurrent_batches": "batches in flight at once: 2 schedules step N+1 on the engine "
                              "thread while step N computes on a worker thread (vLLM's batch "
                              "queue; outputs unchanged). 1 (default): off",
    "stream_interval": "streaming requests get an output every k tokens (always the first "
                       "and the last); 1: every step",
    "max_logprobs": "most logprobs / prompt_logprobs a request may ask for (-1: no limit)",
    "log_stats": "log running/waiting, KV usage, prefix hit rate and tokens/s periodically",
    "enable_lora": "serve LoRA adapters (PEFT directories) per request; CUDA graphs and the CPU "
                   "fused decode step are off for batches with an adapter",
    "max_loras": "most distinct LoRA adapters in one batch",
    "max_lora_rank": "largest LoRA rank accepted",
    "max_cpu_loras": "most LoRA adapters kept loaded (default: max_loras); least recently used "
                     "unpinned ones are unloaded beyond it",
    "otlp_traces_endpoint": "OTLP/gRPC endpoint for traces, e.g. http://127.0.0.1:4317",
    "runner": "generate (default): continue prompts; pooling: embed them (LLM.embed, "
              "/v1/embeddings) instead",
    "pooler_config": "how a pooling runner embeds a prompt, a JSON object as vLLM's: "
                     "'{\"pooling_type\": \"MEAN\", \"normalize\": false}' (default: LAST, "
                     "the last token's final hidden state, normalized)",
    "hf_overrides": "config.json fields to replace, a JSON object as vLLM's, e.g. "
                    "'{\"architectures\": [\"Qwen3ForSequenceClassification\"], "
                    "\"classifier_from_token\": [\"no\", \"yes\"], \"method\": "
                    "\"from_2_way_softmax\"}' to serve a causal reranker as a classifier",
}


_CHOICES = {"reasoning_parser": sorted(REASONING_PARSERS), "runner": list(RUNNERS)}


def json_object(text: str) -> dict[str, Any]:
    """A JSON-object flag's value; argparse prints the error after the flag's name."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def _cli_type(annotation: object) -> Any:
    text = str(annotation)
    if "int" in text:
        return int
    if "float" in text:
        return float
    return str
