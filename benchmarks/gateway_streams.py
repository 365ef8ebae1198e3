"""Every request of a workload as its own Generate stream at once, as coroutines on one
AsyncEngineClient (one event loop, one channel).

Not one blocking EngineClient stream per thread: each thread blocked in gRPC's blocking read
wakes ten times a second (grpc._common.MAXIMUM_WAIT_TIMEOUT), and with 64 streams that came to
0.23-0.30 CPU seconds per run of the standard workload, taken from the engine's cores where the
benchmark shares them: more than the tokenizer, detokenizer and gateway together.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from tqdm import tqdm

from benchmarks.common import ended_badly
from benchmarks.datasets import SampleRequest
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams


@dataclass(slots=True)
class StreamsRun:
    outputs: list[list[int]]  # per request, in workload order: every token it received
    num_failed: int  # ended with an error, or without a finished output
    elapsed_s: float


def generate_all(target: str, requests: list[SampleRequest], output_kind: RequestOutputKind,
                 desc: str = "streams") -> StreamsRun:
    """output_kind FINAL_ONLY (one output each) or DELTA (every step's new tokens)."""
    if output_kind == RequestOutputKind.CUMULATIVE:
        raise ValueError("output_kind must be FINAL_ONLY or DELTA: outputs are added up")
    return asyncio.run(_generate_all(target, requests, output_kind, desc))


async def _generate_all(target: str, requests: list[SampleRequest],
                        output_kind: RequestOutputKind, desc: str) -> StreamsRun:
    from strand.services.async_client import AsyncEngineClient

    outputs: list[list[int]] = [[] for _ in requests]
    bar = tqdm(total=len(requests), desc=desc, unit="req", leave=False)
    async with AsyncEngineClient(target, timeout=None) as client:
        await client.get_server_info()  # before the clock: which mode the gateway is in

        async def one(index: int) -> bool:
            r = requests[index]
            params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True,
                                    output_kind=output_kind)
            finished = False
            async for out in client.generate({"prompt_token_ids": r.prompt_token_ids}, params,
                                             request_id=str(index)):
                if ended_badly(desc, out):
                    return False
                if out.outputs:
                    outputs[index].extend(out.outputs[0].token_ids)
                finished = out.finished
            bar.update(1)
            return finished

        start = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(len(requests))))
        elapsed = time.perf_counter() - start
    bar.close()
    return StreamsRun(outputs, sum(1 for ok in done if not ok), elapsed)
