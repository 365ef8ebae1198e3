"""Where a GPU decode step's time goes: host time per engine step, split into its parts, against
the GPU's kernel time per step.

    python -m benchmarks.gpu_step_profile --preset llama-3.2-1b --dtype bfloat16 --batch-size 1

--batch-size requests of --prompt-len random tokens are prefilled (untimed), then three passes of
--steps decode steps each:
1. plain: wall time per `LLMEngine.step()`, nothing added;
2. parts: the scheduler, the runner's input preparation, the forward (graph replay or eager
   layers, then the lm_head), the sampler, the scheduler's update and the rest of the step
   (output processing, detokenizing). Each part ends with a device synchronize so its wall time
   holds its own GPU work; the sum is a little above pass 1 for those syncs.
3. kernels: torch.profiler's CUDA kernel time per step (the GPU busy time) and launches per step,
   with the costliest kernels.
"Host overhead" is pass 1's wall time minus the GPU busy time: what the scheduler, Python and
launch gaps add to a step the kernels alone would take.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from benchmarks.common import add_model_args, format_table, log, resolve_device, resolve_model

PARTS = (("scheduler", "schedule"), ("runner", "prepare_inputs"), ("runner", "compute_logits"),
         ("runner", "_sample"), ("scheduler", "update_from_output"))


def _sync() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _wrap_parts(core: Any, spent: dict[str, list[float]]) -> Callable[[], None]:
    owners = {"scheduler": core.scheduler, "runner": core.runner}
    originals = []
    for owner_name, attr in PARTS:
        owner = owners[owner_name]
        original = getattr(owner, attr)
        originals.append((owner, attr, original))

        def timed(*args: Any, _f: Any = original, _name: str = attr, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = _f(*args, **kwargs)
            _sync()
            spent[_name].append(time.perf_counter() - start)
            return result

        setattr(owner, attr, timed)

    def restore() -> None:
        for owner, attr, original in originals:
            setattr(owner, attr, original)
    return restore


def _start_batch(engine: Any, args: argparse.Namespace, vocab: int, tag: str) -> None:
    from strand.engine_core import SamplingParams

    rng = random.Random(tag)
    # Enough tokens for the warm-up and all three passes; aborted at the end.
    params = SamplingParams(temperature=0.0, max_tokens=3 * args.steps + 16, ignore_eos=True)
    for i in range(args.batch_size):
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_len)]
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": prompt}, params)
    engine.step()  # the prefill, untimed
    for _ in range(8):  # warm-up decode steps
        engine.step()


def _end_batch(engine: Any, tag: str, batch_size: int) -> None:
    engine.abort_request([f"{tag}-{i}" for i in range(batch_size)])
    while engine.has_unfinished_requests():
        engine.step()


def profile(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from strand.engine_core import EngineArgs, LLMEngine

    device = resolve_device(args.device)  # on a CPU the GPU columns read 0 (a smoke test)
    model_dir = resolve_model(args)
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), dtype=args.dtype, device=device, max_num_seqs=max(args.batch_size, 8),
        max_model_len=args.prompt_len + 4 * args.steps + 64, enable_prefix_caching=False,
        enforce_eager=args.enforce_eager, gpu_memory_utilization=0.5))
    vocab = engine.engine_core.runner.model_config.vocab_size
    core = engine.engine_core

    _start_batch(engine, args, vocab, "plain")
    walls = []
    for _ in range(args.steps):
        start = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - start)

    spent: dict[str, list[float]] = defaultdict(list)
    restore = _wrap_parts(core, spent)
    totals = []
    for _ in range(args.steps):
        start = time.perf_counter()
        engine.step()
        totals.append(time.perf_counter() - start)
    restore()

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.steps):
            engine.step()
        _sync()
    _end_batch(engine, "plain", args.batch_size)

    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"
               and e.self_device_time_total > 0]
    gpu_us = sum(e.self_device_time_total for e in kernels) / args.steps
    launches = sum(e.count for e in kernels) / args.steps
    top = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:args.top]
    wall_ms = 1e3 * statistics.median(walls)
    parts_ms = {name: 1e3 * statistics.median(v) for name, v in spent.items()}
    parts_ms["rest of step"] = 1e3 * statistics.median(totals) - sum(parts_ms.values())
    return {
        "model": str(model_dir), "dtype": args.dtype, "batch_size": args.batch_size,
        "enforce_eager": args.enforce_eager, "wall_ms_per_step": wall_ms,
        "gpu_busy_ms_per_step": gpu_us / 1e3, "host_overhead_ms_per_step": wall_ms - gpu_us / 1e3,
        "kernel_launches_per_step": launches, "parts_ms": parts_ms,
        "top_kernels": [(e.key[:70], e.self_device_time_total / args.steps, e.count / args.steps)
                        for e in top],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--top", type=int, default=12, help="kernels listed")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.steps < 1:
        parser.error("--batch-size and --steps must be >= 1")
    result = profile(args)
    log(f"{result['model']} ({args.dtype}), batch {args.batch_size}, "
        f"{'eager' if args.enforce_eager else 'CUDA graphs'}")
    print(f"wall {result['wall_ms_per_step']:.3f} ms/step; GPU busy "
          f"{result['gpu_busy_ms_per_step']:.3f} ms/step; host overhead "
          f"{result['host_overhead_ms_per_step']:.3f} ms/step; "
          f"{result['kernel_launches_per_step']:.0f} kernels/step")
    print(format_table(["part (synchronized)", "ms/step"],
                       [[k, f"{v:.3f}"] for k, v in result["parts_ms"].items()]))
    print(format_table(["kernel", "us/step", "calls/step"],
                       [[k, f"{us:.1f}", f"{n:.1f}"] for k, us, n in result["top_kernels"]]))


if __name__ == "__main__":
    main()
