"""Where one thread's time goes in cpu_peers' batch32 workload: CPU time (time.thread_time, so
waiting for a core on a shared machine is not counted) of its prefill step and decode steps.

    python -m benchmarks.batch_profile [--hf-dir DIR] [--dtype float32|bfloat16]
        [--isa native|avx2] [--requests 32] [--prompt 128] [--tokens 128]

The workload of benchmarks/cpu_peers.py (`batch32`): --requests random prompts of --prompt
tokens added at once (one prefill step of all of them, max_num_batched_tokens 4096), then
--tokens - 1 decode steps of every request, greedy, one thread. After a warm-up run of 4 tokens,
prints the prefill step, the median decode step and the whole run, and the decode step split
into parts: the decoder layers (one C++ call where models/llama_fused_decode.py takes the step, else
the linear layers, attention, norms, rotary and silu-and-mul called one by one), the lm_head, the
sampler and the rest (Python around them: the model's forward, the runner, the engine step).
--isa avx2 profiles an AVX2-only CPU on a wider one (benchmarks/isa_emulation.py).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import format_table, log
from benchmarks.decode_profile import Timers

DEFAULT_HF_DIR = Path.home() / ".cache/strand/bench/smollm2-135m-f32-hf"


def instrument(engine: Any, timers: Timers) -> None:
    from strand.engine_core.model_executor.layers import activation
    from strand.engine_core.model_executor.layers.linear import Linear
    from strand.engine_core.model_executor.layers.rms_norm import RMSNorm
    from strand.engine_core.model_executor.layers.rotary_embedding import RotaryEmbedding
    from strand.engine_core.model_executor.models import llama
    from strand.engine_core.model_executor.models import llama_fused_decode as fused_decode

    runner = engine.engine_core.runner
    timers.wrap(engine, "step", "rest (engine, runner, model)")
    timers.wrap(runner, "_sample", "sampler")
    timers.wrap(runner.model, "compute_logits", "lm_head")
    timers.wrap(fused_decode, "forward", "decoder layers (fused C++ call)")
    timers.wrap(fused_decode, "logits", "decoder layers and lm_head (fused C++ call)")
    timers.wrap(runner.attn_backend, "forward", "attention (KV write included)")
    for owner, attr, name in ((Linear, "forward", "linear layers"),
                              (RMSNorm, "forward", "RMSNorm"),
                              (RotaryEmbedding, "forward", "rotary"),
                              (llama, "act_and_mul", "silu-and-mul"),
                              (activation, "act_and_mul", "silu-and-mul")):
        timers.wrap(owner, attr, name)


def run(engine: Any, timers: Timers, seed: int, args: argparse.Namespace,
        keep: bool) -> tuple[float, list[float]]:
    """(prefill step seconds, decode step seconds), one thread's CPU time."""
    from strand.engine_core import SamplingParams

    vocab = engine.engine_core.vocab_size
    rng = random.Random(seed)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    for i in range(args.requests):
        engine.add_request(f"{seed}-{i}", {"prompt_token_ids": [
            rng.randrange(min(100, vocab // 2), vocab - 1) for _ in range(args.prompt)]}, params)
    steps: list[float] = []
    while engine.has_unfinished_requests():
        start = time.thread_time()
        engine.step()
        steps.append(time.thread_time() - start)
        timers.end_step(keep and len(steps) > 1)  # decode steps only
    return steps[0], steps[1:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-dir", default=str(DEFAULT_HF_DIR))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--isa", default="avx2", choices=["native", "avx2"])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.prompt < 1 or args.tokens < 2:
        parser.error("--requests and --prompt must be >= 1 and --tokens >= 2")
    from benchmarks.isa_emulation import isa_env

    os.environ.update(isa_env(args.isa))  # before torch: its libraries read it once
    from strand.engine_core import EngineArgs, LLMEngine

    engine = LLMEngine.from_engine_args(EngineArgs(
        model=args.hf_dir, dtype=args.dtype, cpu_threads=1, max_model_len=args.prompt
        + args.tokens + 8, enable_prefix_caching=False, max_num_seqs=args.requests,
        max_num_batched_tokens=max(4096, args.requests * args.prompt)))
    timers = Timers()
    instrument(engine, timers)
    run(engine, timers, 0, argparse.Namespace(**{**vars(args), "tokens": 4}), keep=False)
    prefill, decode = run(engine, timers, 1, args, keep=True)
    log(f"{args.requests} x ({args.prompt} in, {args.tokens} out), {args.dtype}, ISA {args.isa},"
        f" one thread, load {os.getloadavg()[0]:.1f}")
    step = statistics.median(decode)
    rows = [["prefill step", f"{1e3 * prefill:.0f}"], ["decode step (median)", f"{1e3 * step:.1f}"],
            ["whole run", f"{1e3 * (prefill + sum(decode)):.0f}"]]
    names = sorted({n for s in timers.steps for n in s})
    rows += [[f"  {n}", f"{1e3 * statistics.median(s.get(n, 0.0) for s in timers.steps):.1f}"]
             for n in names]
    print(format_table(["part", "CPU ms"], rows))


if __name__ == "__main__":
    main()
