"""One client's cancellation storm never touches another client's streams, and leaves nothing
behind in the engine (the gateway's and the engine's request sets stay equal)."""

from __future__ import annotations

import asyncio
import random
import time

import grpc

from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import inference_pb2_grpc
from strand.services.client import EngineClient
from strand.services.common.convert import params_to_pb, prompt_to_pb
from strand.services.launch import Stack
from tests.e2e.conftest import API_KEY, engine_num_unfinished

NUM_CANCELLED = 80
NUM_STEADY = 4


async def _storm(address: str) -> tuple[list[str], int]:
    """Steady streams run to their end while many others are cancelled 0-60 ms in."""
    metadata = (("authorization", f"Bearer {API_KEY}"),)
    rng = random.Random(7)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        def generate(request_id: str, max_tokens: int) -> grpc.aio.UnaryStreamCall:
            return stub.Generate(gpb.GenerateRequest(
                request_id=request_id, prompt=prompt_to_pb("a steady stream of words"),
                params=params_to_pb(SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                   ignore_eos=True))),
                metadata=metadata, timeout=120)

        async def steady(i: int) -> str:
            last = None
            async for output in generate(f"steady-{i}", 40):
                last = output
            assert last is not None
            return last.outputs[0].finish_reason

        async def cancelled(i: int) -> None:
            call = generate(f"storm-{i}", 200)
            await asyncio.sleep(rng.uniform(0.0, 0.06))
            call.cancel()

        steady_tasks = [asyncio.ensure_future(steady(i)) for i in range(NUM_STEADY)]
        await asyncio.gather(*(cancelled(i) for i in range(NUM_CANCELLED)))
        reasons = await asyncio.gather(*steady_tasks)
    return list(reasons), NUM_CANCELLED


def test_a_cancellation_storm_leaves_other_streams_and_the_engine_clean(
        auto_stack: Stack, auto_client: EngineClient) -> None:
    reasons, _ = asyncio.run(_storm(auto_stack.gateway_address))
    assert reasons == ["length"] * NUM_STEADY
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (engine_num_unfinished(auto_stack)
                                           or auto_client.get_num_unfinished_requests()):
        time.sleep(0.1)
    assert auto_client.get_num_unfinished_requests() == 0
    assert engine_num_unfinished(auto_stack) == 0
