"""Where a prefill step's CPU time goes, part by part, as CPU time of the calling thread.

    python -m benchmarks.prefill_profile --hf-dir DIR [--dtype float32|bfloat16] [--tokens 512]
        [--threads 1] [--repeats 5] [--isa native|avx2]

Runs one --tokens prompt through the engine (max_tokens=1: the step is the prefill) --repeats
times after a warm-up, with the parts of the Llama forward wrapped in timers: the linear layers,
the lm_head, attention (the backend's forward less the KV write inside it), the KV write,
RMSNorm (with its fused residual add), rotary, silu-and-mul; "python and the rest" is the step
less the parts. Times are `time.thread_time` of the thread that runs the step: with --threads 1
every kernel runs on that thread, and its CPU time is far steadier than wall time on a shared
machine (at load 8 on 2 cores: a few % between runs, where wall time moved 20%). With more threads the parts' figures are
the calling thread's share only; the wall time per step is printed beside them.
Each part's figure is the median over the repeats. --isa avx2 profiles an AVX2-only CPU on a
wider one (benchmarks/isa_emulation.py: set before torch is imported).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.common import format_table

PARTS = ("linear layers", "lm_head", "attention", "KV write", "RMSNorm", "rotary",
         "silu-and-mul")


class PartTimer:
    """Exclusive CPU time per part: a part's time excludes the parts timed inside it."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self._stack: list[float] = []  # per open part: CPU time of the parts nested inside

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = time.thread_time()
        self._stack.append(0.0)
        try:
            yield
        finally:
            inner = self._stack.pop()
            spent = time.thread_time() - start
            self.totals[name] = self.totals.get(name, 0.0) + spent - inner
            if self._stack:
                self._stack[-1] += spent

    def wrap(self, fn: Callable[..., Any], name: str | Callable[..., str]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.part(name(*args) if callable(name) else name):
                return fn(*args, **kwargs)
        return timed

    def reset(self) -> dict[str, float]:
        totals, self.totals = self.totals, {}
        return totals


@contextmanager
def instrumented(timer: PartTimer, model: Any) -> Iterator[None]:
    """Wraps the Llama forward's parts (class attributes and module globals, so every layer)
    while the block runs; the originals are back afterwards."""
    from strand.engine_core.model_executor.attention import torch_ref
    from strand.engine_core.model_executor.layers import linear, rms_norm, rotary_embedding
    from strand.engine_core.model_executor.models import llama

    lm_head = model.lm_head
    targets: list[tuple[Any, str, str | Callable[..., str]]] = [
        (linear.Linear, "forward",
         lambda self, *_: "lm_head" if self is lm_head else "linear layers"),
        (rms_norm.RMSNorm, "forward", "RMSNorm"),
        (rotary_embedding.RotaryEmbedding, "forward", "rotary"),
        (torch_ref.TorchAttentionBackend, "forward", "attention"),
        (torch_ref, "write_kv_cache", "KV write"),  # called inside the backend's forward
        (llama, "act_and_mul", "silu-and-mul"),
    ]
    originals = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in targets]
    try:
        for owner, attr, name in targets:
            setattr(owner, attr, timer.wrap(getattr(owner, attr), name))
        yield
    finally:
        for owner, attr, original in originals:
            setattr(owner, attr, original)


def profile(args: argparse.Namespace) -> dict[str, Any]:
    import random

    from strand.engine_core import EngineArgs, LLMEngine, SamplingParams

    engine = LLMEngine.from_engine_args(EngineArgs(
        model=args.hf_dir, dtype=args.dtype, cpu_threads=args.threads,
        max_model_len=max(2048, args.tokens + 16), enable_prefix_caching=False,
        max_num_batched_tokens=max(4096, args.tokens)))
    core = engine.engine_core
    model = core.runner.model  # the in-process runner's model
    timer = PartTimer()
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    steps: list[dict[str, float]] = []
    with instrumented(timer, model):
        for rep in range(args.repeats + 1):  # the first is the warm-up
            prompt = [rng.randrange(100, core.vocab_size - 1) for _ in range(args.tokens)]
            engine.add_request(f"p{rep}", {"prompt_token_ids": prompt}, params)
            timer.reset()
            wall = time.perf_counter()
            with timer.part("python and the rest"):
                while engine.has_unfinished_requests():
                    engine.step()
            wall = time.perf_counter() - wall
            parts = timer.reset()
            parts["step"] = sum(parts.values())
            parts["wall"] = wall
            if rep:
                steps.append(parts)
    names = ["step", *PARTS, "python and the rest", "wall"]
    return {name: statistics.median(s.get(name, 0.0) for s in steps) * 1e3 for name in names}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prefill_profile",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf-dir", required=True, help="HF checkpoint directory")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--tokens", type=int, default=512, help="prompt length")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--isa", default="native", choices=["native", "avx2"],
                        help="avx2: capped as an AVX2-only CPU (benchmarks/isa_emulation.py)")
    args = parser.parse_args(argv)
    if args.tokens < 2 or args.threads < 1 or args.repeats < 1:
        parser.error("--tokens must be >= 2, --threads and --repeats >= 1")
    # Read once by torch, oneDNN and MKL at first use: set before anything imports them.
    from benchmarks.isa_emulation import isa_env

    os.environ.update(isa_env(args.isa))
    ms = profile(args)
    rows = [[name, f"{value:.1f}"] for name, value in ms.items()]
    print(format_table([f"prefill {args.tokens}, {args.dtype}, {args.threads} thread(s), "
                        f"ISA {args.isa}",
                        "CPU ms (median)"], rows))


if __name__ == "__main__":
    main()
