"""Where a one-thread bs=1 decode step's time goes: CPU time (time.thread_time, so waiting for a
core on a shared machine is not counted) of the engine step split into its parts.

    python -m benchmarks.decode_profile [--model smollm2|FILE.gguf] [--quantization gguf]
        [--dtype float32|bfloat16] [--isa native|avx2] [--prompt 32] [--tokens 128] [--repeats 3]

One request, --prompt random tokens then --tokens greedy decode steps, one thread (the C++
kernels' OpenMP pool and torch's, so every part runs on the calling thread and thread_time
covers it). Parts, per decode step: the 30 decoder layers (the fused C++ call of all of them where it
applies; where that call holds the embedding, final norm and lm_head too, one part from token ids
to logits), the embedding and final norm, the lm_head, the sampler, the rest of the runner's
execute_model (inputs, state updates), and the engine step around it (scheduler, output
processing, detokenizing). Medians over the decode steps of the --repeats runs after a warm-up.
--dtype is the engine dtype of dequantized weights (--quantization none); --isa avx2 profiles an
AVX2-only CPU on a wider one (benchmarks/isa_emulation.py: set before torch is imported).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.common import format_table, log

# time.thread_time at one thread (waiting for a core is not counted); the wall clock with more
# (the worker threads' share of a part is not in the calling thread's CPU time).
_CLOCK = time.thread_time


class Timers:
    """CPU seconds per named part, appended once per step; nested parts are subtracted from
    their parent (each part's own time)."""

    def __init__(self) -> None:
        self.step: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self._stack: list[list[float]] = []  # [start, time of nested parts]

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        self._stack.append([_CLOCK(), 0.0])
        try:
            yield
        finally:
            start, nested = self._stack.pop()
            spent = _CLOCK() - start
            self.step[name] += spent - nested
            if self._stack:
                self._stack[-1][1] += spent

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        inner: Callable[..., Any] = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.part(name):
                return inner(*args, **kwargs)

        setattr(owner, attr, timed)

    def end_step(self, keep: bool) -> None:
        if keep:
            self.steps.append(dict(self.step))
        self.step.clear()


def instrument(engine: Any, timers: Timers) -> Callable[[], None]:
    """Timing wrappers around the parts of a decode step (instance attributes, and the C++
    module the fused decode path calls); returns what puts that module back."""
    from strand.engine_core.model_executor.models import llama_fused_decode as fused_decode

    runner = engine.engine_core.runner
    model = runner.model
    timers.wrap(runner, "execute_model", "runner (inputs, state, rest)")
    timers.wrap(runner, "_sample", "sampler")
    timers.wrap(model, "compute_logits", "lm_head")
    timers.wrap(model, "forward", "embedding, final norm, step checks")
    timers.wrap(model.model.norm, "forward", "embedding, final norm, step checks")
    # Where the stack holds the ends, the step's Python is decode_logits, its C++ one call.
    timers.wrap(model, "decode_logits", "embedding, final norm, step checks")
    built = fused_decode.KERNELS.module()
    if built is None:
        raise RuntimeError("the C++ kernels are needed (python -m strand.kernels.build)")
    module: Any = built

    class TimedStack:  # a DecodeStack whose step (all the layers, one call) is timed
        def __init__(self, stack: Any) -> None:
            self.stack = stack

        def __getattr__(self, attr: str) -> Any:  # add_layer, set_ends: as they are
            return getattr(self.stack, attr)

        def forward(self, *args: Any) -> Any:
            with timers.part("decoder layers (fused C++)"):
                return self.stack.forward(*args)

        def logits(self, *args: Any) -> Any:
            with timers.part("embedding, layers, final norm, lm_head (fused C++)"):
                return self.stack.logits(*args)

    class Timed:  # the module, its DecodeStacks timed, its other functions as they are
        def __getattr__(self, attr: str) -> Any:
            return getattr(module, attr)

        @staticmethod
        def DecodeStack(*args: Any) -> Any:  # noqa: N802 - the C++ class's name
            return TimedStack(module.DecodeStack(*args))

    fused_decode._STACKS.clear()  # stacks built before this are rebuilt, timed
    fused_decode.KERNELS._module = Timed()  # type: ignore[assignment]

    def restore() -> None:
        fused_decode.KERNELS._module = built
        fused_decode._STACKS.clear()

    return restore


def profile(args: argparse.Namespace) -> dict[str, float]:
    global _CLOCK
    import torch

    from strand.engine_core import EngineArgs, LLMEngine
    from strand.engine_core.default_model import gguf_file

    source = gguf_file(args.model)
    if source is None:
        raise ValueError(f"--model must name a .gguf file, got {args.model!r}")
    threads = torch.get_num_threads()
    _CLOCK = time.thread_time if args.threads == 1 else time.perf_counter
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=source, dtype=args.dtype, quantization=args.quantization, cpu_threads=args.threads,
        max_model_len=args.prompt + args.tokens + 8, enable_prefix_caching=False,
        max_num_seqs=1))
    timers = Timers()
    restore = instrument(engine, timers)
    try:
        _decode(engine, timers, args)
    finally:
        restore()
        torch.set_num_threads(threads)
    names = sorted({n for s in timers.steps for n in s})
    return {n: 1e3 * statistics.median(s.get(n, 0.0) for s in timers.steps) for n in names} | {
        "total": 1e3 * statistics.median(sum(s.values()) for s in timers.steps)}


def _decode(engine: Any, timers: Timers, args: argparse.Namespace) -> None:
    from strand.engine_core import SamplingParams

    vocab = engine.engine_core.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    for rep in range(args.repeats + 1):  # the first is the warm-up
        rng = random.Random(rep)
        engine.add_request(f"r{rep}", {"prompt_token_ids": [
            rng.randrange(min(100, vocab // 2), vocab - 1) for _ in range(args.prompt)]}, params)
        first = True
        while engine.has_unfinished_requests():
            with timers.part("engine step (scheduler, outputs)"):
                engine.step()
            timers.end_step(keep=rep > 0 and not first)  # decode steps only
            first = False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a .gguf file or a short name")
    parser.add_argument("--quantization", default="gguf", choices=["gguf", "none"],
                        help="gguf: weights read packed; none: dequantized at load")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the engine dtype (of the dequantized weights with --quantization none)")
    parser.add_argument("--isa", default="native", choices=["native", "avx2"],
                        help="avx2: capped as an AVX2-only CPU (benchmarks/isa_emulation.py)")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="1: CPU time of the one thread; more: wall time of each part")
    args = parser.parse_args(argv)
    for name in ("prompt", "tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.quantization == "none":
        args.quantization = None
    # Read once by torch, oneDNN and MKL at first use: set before anything imports them.
    from benchmarks.isa_emulation import isa_env

    os.environ.update(isa_env(args.isa))
    log(f"profiling {args.threads}-thread bs=1 decode of {args.model} "
        f"({args.quantization or args.dtype}, ISA {args.isa})")
    result = profile(args)
    total = result["total"]
    rows = [[name, f"{ms:.2f}", f"{ms / total:.0%}"] for name, ms in result.items()]
    clock = "CPU ms (median)" if args.threads == 1 else "wall ms (median)"
    print(format_table(["part of a decode step", clock, "share"], rows))


if __name__ == "__main__":
    main()
