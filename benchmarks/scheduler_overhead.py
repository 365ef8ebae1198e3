"""Scheduler overhead: microseconds per schedule() + update_from_output() with N decoding requests.

No model: the runner's output is built outside the timed region, so only the core's bookkeeping
is measured. Goal: under 1 ms per step with 256 requests on a 2-core CPU.

    python -m benchmarks.scheduler_overhead [--num-requests 256] [--steps 500]
"""

from __future__ import annotations

import argparse
import time

from strand.engine_core.config import CacheConfig, SchedulerConfig
from strand.engine_core.core.request import Request
from strand.engine_core.core.runner_output import ModelRunnerOutput
from strand.engine_core.core.sched_output import SchedulerOutput
from strand.engine_core.core.scheduler import Scheduler
from strand.engine_core.sampling_params import SamplingParams


def _runner_output(out: SchedulerOutput, token: int) -> ModelRunnerOutput:
    req_ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids, {rid: i for i, rid in enumerate(req_ids)},
                             [[token] for _ in req_ids])


def measure(num_requests: int, prompt_len: int, steps: int, block_size: int,
            prefix_caching: bool) -> float:
    """Mean microseconds per decode step (schedule + update) once all requests are decoding."""
    max_model_len = prompt_len + steps + 64
    blocks_per_req = -(-max_model_len // block_size)
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=max(8192, num_requests * prompt_len),
                        max_num_seqs=num_requests, max_model_len=max_model_len),
        CacheConfig(block_size=block_size, enable_prefix_caching=prefix_caching),
        num_blocks=num_requests * blocks_per_req + 1)
    params = SamplingParams(max_tokens=steps + 32, ignore_eos=True)
    for i in range(num_requests):
        prompt = [(i * 7919 + j) % 32000 for j in range(prompt_len)]
        scheduler.add_request(Request(f"req-{i}", prompt, params, eos_token_id=2))
    # Prefill everything first: the figure is about the steady decode state.
    out = scheduler.schedule()
    scheduler.update_from_output(out, _runner_output(out, 1))
    total = 0.0
    token = 3
    for _ in range(steps):
        t0 = time.perf_counter()
        out = scheduler.schedule()
        t1 = time.perf_counter()
        runner_output = _runner_output(out, token)
        t2 = time.perf_counter()
        scheduler.update_from_output(out, runner_output)
        t3 = time.perf_counter()
        total += (t1 - t0) + (t3 - t2)
        assert out.num_reqs == num_requests
        token = (token + 1) % 32000
    return total / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    for caching in (True, False):
        us = measure(args.num_requests, args.prompt_len, args.steps, args.block_size, caching)
        print(f"scheduler overhead: {us:.0f} us/step ({us / args.num_requests:.2f} us/request), "
              f"{args.num_requests} decoding requests, block_size {args.block_size}, "
              f"prefix caching {'on' if caching else 'off'}")


if __name__ == "__main__":
    main()
