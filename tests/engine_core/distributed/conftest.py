"""Builders for tensor-parallel tests: one scenario run on an engine of N ranks (gloo on
127.0.0.1, one CPU thread per rank), returning what the parity tests compare."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strand.engine_core import EngineArgs, LLMEngine, RequestOutput, SamplingParams

MAX_TOKENS = 8
# LoRA on: two adapters per batch (as tests/engine_core/lora's engine), 4-token blocks.
LORA_ARGS: dict[str, Any] = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8,
                             "max_cpu_loras": 3, "block_size": 4}


@contextmanager
def tp_engine(model_dir: Path, tp: int, **overrides: Any) -> Iterator[LLMEngine]:
    args: dict[str, Any] = {"model": str(model_dir), "dtype": "float32", "device": "cpu",
                            "tensor_parallel_size": tp, "cpu_threads": 1,
                            "distributed_timeout_s": 30.0}
    args.update(overrides)
    engine = LLMEngine.from_engine_args(EngineArgs(**args))
    try:
        yield engine
    finally:
        engine.shutdown()


@contextmanager
def worker_node(tp: int, master_port: int) -> Iterator[subprocess.Popen[bytes]]:
    """`strand worker` as node 1 of 2 on loopback: the ranks of the second half."""
    cmd = [sys.executable, "-m", "strand.services.cli", "worker", "--tensor-parallel-size", str(tp),
           "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
           "--master-port", str(master_port), "--distributed-timeout-s", "60"]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        yield proc
    finally:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class ScenarioResult:
    tokens: dict[str, list[int]]
    logprobs: dict[str, list[float]]  # the sampled token's logprob, per step
    num_preemptions: int
    prefix_hits: int


def run_scenario(engine: LLMEngine, vocab_size: int) -> ScenarioResult:
    """Chunked prefill (16-token budget), preemption (a 14-block pool of 8-token blocks, and
    reset_prefix_cache(reset_running_requests=True) mid-run), prompt logprobs over chunks, and a
    prefix hit (a prompt sharing 32 tokens with one whose blocks are cached by then)."""
    rng = random.Random(5)
    prompts = [[rng.randrange(3, vocab_size) for _ in range(n)] for n in (40, 9, 27, 38)]
    prompts[3] = prompts[0][:32] + prompts[3][32:]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1)
    finished: dict[str, RequestOutput] = {}

    def step() -> None:
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                finished[out.request_id] = out

    for i in range(3):
        engine.add_request(str(i), {"prompt_token_ids": prompts[i]},
                           SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1,
                                          prompt_logprobs=1) if i == 2 else params)
    for _ in range(2):
        step()
    assert engine.reset_prefix_cache(reset_running_requests=True)
    for _ in range(7):
        step()
    engine.add_request("3", {"prompt_token_ids": prompts[3]}, params)
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        step()
    assert not engine.has_unfinished_requests(), "engine still busy after 200 steps"
    stats = engine.engine_core.scheduler.make_stats()
    tokens, logprobs = {}, {}
    for req_id, out in finished.items():
        completion = out.outputs[0]
        tokens[req_id] = list(completion.token_ids)
        assert completion.logprobs is not None
        logprobs[req_id] = [step_lp[t].logprob
                            for t, step_lp in zip(completion.token_ids, completion.logprobs,
                                                  strict=True)]
        if out.prompt_logprobs is not None:  # position 0 has none
            logprobs[req_id] += [lp[t].logprob for t, lp in zip(
                out.prompt_token_ids or [], out.prompt_logprobs, strict=True) if lp is not None]
    return ScenarioResult(tokens, logprobs, stats.num_preemptions,
                          stats.prefix_cache_stats.hits)


SCENARIO_ARGS: dict[str, Any] = {"block_size": 8, "num_gpu_blocks_override": 14,
                                 "max_num_batched_tokens": 16, "max_num_seqs": 4}
