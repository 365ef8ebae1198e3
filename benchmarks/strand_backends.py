"""Strand as a benchmark backend: LLMEngine in this process, or the same loop through the gateway.

Both run add_request for every prompt, then step() until nothing is unfinished (what vLLM's
`LLM.generate` does), with FINAL_ONLY outputs so neither pays for per-step output objects.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from benchmarks.common import BackendResult, blocks_holding, ended_badly, log
from benchmarks.datasets import SampleRequest

WARMUP_TOKENS = 4


@dataclass(slots=True)
class StrandSettings:
    dtype: str = "float32"
    device: str = "cpu"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    kv_cache_memory: int | None = None  # bytes; None: enough for the whole workload at once

    def engine_flags(self) -> list[str]:
        """The same settings as CLI flags, for the stack's engine process."""
        flags = ["--dtype", self.dtype, "--device", self.device, "--max-num-seqs", str(self.max_num_seqs),
                 "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                 "--enable-prefix-caching" if self.enable_prefix_caching
                 else "--no-enable-prefix-caching"]
        if self.kv_cache_memory is not None:
            flags += ["--kv-cache-memory", str(self.kv_cache_memory)]
        return flags


class _Engine(Protocol):
    def add_request(self, request_id: str, prompt: Any, params: Any = None) -> None: ...

    def step(self) -> list[Any]: ...

    def has_unfinished_requests(self) -> bool: ...


def kv_cache_bytes(config: dict[str, Any], requests: list[SampleRequest], dtype_bytes: int,
                   block_size: int = 16) -> int:
    """Bytes of KV cache that hold every request at once (whole blocks, plus the reserved one)."""
    blocks = blocks_holding([r.prompt_len + r.output_len for r in requests], block_size)
    return blocks * block_size * kv_bytes_per_token(config, dtype_bytes)


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int) -> int:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes


def run_inprocess(model_dir: str, requests: list[SampleRequest],
                  settings: StrandSettings) -> BackendResult:
    from strand.engine_core import EngineArgs, LLMEngine

    args = EngineArgs(model=model_dir, dtype=settings.dtype, device=settings.device,
                      max_num_seqs=settings.max_num_seqs,
                      max_num_batched_tokens=settings.max_num_batched_tokens,
                      enable_prefix_caching=settings.enable_prefix_caching)
    if settings.kv_cache_memory is not None:
        args.kv_cache_memory = settings.kv_cache_memory
    engine = LLMEngine.from_engine_args(args)
    warm_up(engine, requests)
    engine.reset_prefix_cache()  # the warm-up's blocks must not count as hits
    result = run_loop("strand", engine, requests)
    result.settings = _settings_dict(settings)
    return result


GATEWAY_PATHS = {
    "streams": "auto-step gateway, one Generate stream per request",
    "step": "manual-step gateway, add_request then step() until done",
}


def run_gateway(model_dir: str, requests: list[SampleRequest], settings: StrandSettings,
                address: str | None = None, num_threads: int | None = None,
                path: str = "streams") -> BackendResult:
    """Through a gateway at `address`, or a stack started here.

    path "streams" (the faster: the gateway pipelines engine steps with detokenizing) opens one
    Generate stream per request on an auto-stepping gateway; "step" runs the in-process loop
    through a manual-step gateway. A gateway at `address` decides by its own mode.
    """
    if path not in GATEWAY_PATHS:
        raise ValueError(f"path must be one of {sorted(GATEWAY_PATHS)}, got {path!r}")
    try:
        from strand.services.client import EngineClient
    except ImportError as exc:
        return BackendResult(backend="strand-gateway",
                             status=f"unavailable: services not built ({exc})")
    gateway_args = ["--auto-step"] if path == "streams" else []
    with _stack(model_dir, settings, address, num_threads, gateway_args) as target:
        with EngineClient(target, timeout=None) as client:
            path = "streams" if client.get_server_info().get("auto_step") else "step"
            log(f"  gateway path: {GATEWAY_PATHS[path]}")
            if path == "streams":
                warm_up_streams(client, requests)
                client.reset_prefix_cache()
                result = run_streams("strand-gateway", target, requests)
            else:
                warm_up(client, requests)
                client.reset_prefix_cache()
                result = run_loop("strand-gateway", client, requests)
    result.settings = {**_settings_dict(settings), "address": address or "launched here",
                       "path": GATEWAY_PATHS[path]}
    return result


def bench_log_dir() -> Path:
    """Where a benchmark's stack writes its stages' logs."""
    return Path(os.environ.get("STRAND_BENCH_LOGS", "/tmp/strand-bench-logs"))


@contextlib.contextmanager
def stage_threads(num_threads: int | None) -> Iterator[None]:
    """OMP_NUM_THREADS=num_threads for the stage processes started inside (the engine process
    must get the thread count this process uses, or the comparison is off); restored after."""
    previous = os.environ.get("OMP_NUM_THREADS")
    if num_threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(num_threads)
    try:
        yield
    finally:
        if num_threads is not None:
            if previous is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = previous


@contextlib.contextmanager
def _stack(model_dir: str, settings: StrandSettings, address: str | None,
           num_threads: int | None, gateway_args: list[str] | None = None) -> Iterator[str]:
    if address:
        yield address
        return
    from strand.services.launch import StackConfig, launch_stack

    log("starting the strand stack (tokenizer, engine, detokenizer, gateway)")
    config = StackConfig(model=model_dir, engine_args=settings.engine_flags(),
                         gateway_args=list(gateway_args or []), log_dir=bench_log_dir())
    with stage_threads(num_threads):
        stack = launch_stack(config)
    try:
        yield stack.gateway_address
    finally:
        stack.stop()


stack_for = _stack  # the serving benchmark starts its (auto-stepping) stack the same way


def warm_up(engine: _Engine, requests: list[SampleRequest]) -> None:
    """A short request or two first: the first steps allocate and pick kernels."""
    from strand.engine_core import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=WARMUP_TOKENS, ignore_eos=True)
    for i, r in enumerate(requests[:2]):
        engine.add_request(f"warmup-{i}", {"prompt_token_ids": r.prompt_token_ids}, params)
    while engine.has_unfinished_requests():
        engine.step()


def warm_up_streams(client: Any, requests: list[SampleRequest]) -> None:
    from strand.engine_core import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=WARMUP_TOKENS, ignore_eos=True)
    for i, r in enumerate(requests[:2]):
        for _ in client.generate({"prompt_token_ids": r.prompt_token_ids}, params,
                                 request_id=f"warmup-{i}"):
            pass


def run_streams(name: str, target: str, requests: list[SampleRequest]) -> BackendResult:
    """Every request on its own Generate stream at once (FINAL_ONLY: one output each)."""
    from benchmarks.gateway_streams import generate_all
    from strand.engine_core.sampling_params import RequestOutputKind

    run = generate_all(target, requests, RequestOutputKind.FINAL_ONLY, desc=name)
    return _result(name, requests, run.outputs, run.num_failed, run.elapsed_s)


def run_loop(name: str, engine: _Engine, requests: list[SampleRequest]) -> BackendResult:
    from strand.engine_core import SamplingParams
    from strand.engine_core.sampling_params import RequestOutputKind

    outputs: list[list[int]] = [[] for _ in requests]
    failed = 0
    bar = tqdm(total=len(requests), desc=name, unit="req", leave=False)
    start = time.perf_counter()
    for i, r in enumerate(requests):
        params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        engine.add_request(str(i), {"prompt_token_ids": r.prompt_token_ids}, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if not out.finished:
                continue
            index = int(out.request_id)
            outputs[index] = list(out.outputs[0].token_ids)
            failed += ended_badly(name, out)
            bar.update(1)
    elapsed = time.perf_counter() - start
    bar.close()
    return _result(name, requests, outputs, failed, elapsed)


def _result(name: str, requests: list[SampleRequest], outputs: list[list[int]], failed: int,
            elapsed: float) -> BackendResult:
    short = sum(1 for r, out in zip(requests, outputs, strict=True) if len(out) != r.output_len)
    return BackendResult(backend=name, elapsed_s=elapsed, num_requests=len(requests),
                         num_failed=max(failed, short),
                         prompt_tokens=sum(r.prompt_len for r in requests),
                         output_tokens=sum(len(out) for out in outputs), outputs=outputs)


def _settings_dict(settings: StrandSettings) -> dict[str, Any]:
    import torch

    return {"max_num_seqs": settings.max_num_seqs,
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "enable_prefix_caching": settings.enable_prefix_caching,
            "kv_cache_memory": settings.kv_cache_memory, "dtype": settings.dtype,
            "device": settings.device,
            "num_threads": torch.get_num_threads()}
