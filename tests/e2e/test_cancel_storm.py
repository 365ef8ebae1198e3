"""One client's cancellation storm never touches another client's streams, and leaves nothing
behind in the engine (the gateway's and the engine's request sets stay equal)."""

from __future__ import annotations

import asyncio
import random
import time

import grpc

from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import gateway_pb2_grpc, inference_pb2_grpc
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


STORM_ROUNDS = 3
STORM_STREAMS = 100
SETTLED_WITHIN_S = 5.0  # after the storm: a few steps' worth, on a busy 2-core machine


async def _cancelled_rounds(address: str) -> tuple[int, bool]:
    """STORM_ROUNDS rounds of STORM_STREAMS long Generate calls, each cancelled 0-60 ms in; then
    (the storm client's unfinished count SETTLED_WITHIN_S later at most, whether
    ResetPrefixCache(reset_running_requests=False) succeeded the moment it reached 0)."""
    metadata = (("authorization", f"Bearer {API_KEY}"),)
    rng = random.Random(11)
    params = params_to_pb(SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        async def cancelled(r: int, i: int) -> None:
            call = stub.Generate(gpb.GenerateRequest(
                request_id=f"round-{r}-{i}", prompt=prompt_to_pb(f"stream {i} of round {r}"),
                params=params), metadata=metadata, timeout=120)
            await asyncio.sleep(rng.uniform(0.0, 0.06))
            call.cancel()

        for r in range(STORM_ROUNDS):
            await asyncio.gather(*(cancelled(r, i) for i in range(STORM_STREAMS)))
        end = time.monotonic() + SETTLED_WITHIN_S
        while True:
            num = (await stub.GetNumUnfinishedRequests(gpb.GetNumUnfinishedRequestsRequest(),
                                                       metadata=metadata, timeout=30)).value
            if num == 0 or time.monotonic() > end:
                break
            await asyncio.sleep(0.01)
        reset = await gateway_pb2_grpc.GatewayStub(channel).ResetPrefixCache(
            gpb.ResetPrefixCacheRequest(reset_running_requests=False), metadata=metadata,
            timeout=30)
    return num, reset.success


def test_after_a_cancel_storm_the_engine_is_empty_within_moments_and_its_cache_resets(
        auto_stack: Stack, auto_client: EngineClient) -> None:
    num_unfinished, reset = asyncio.run(_cancelled_rounds(auto_stack.gateway_address))
    assert num_unfinished == 0
    # The gateway counts a cancelled request until the engine has dropped it: once it says 0,
    # the engine holds nothing and every block is free.
    assert reset
    assert engine_num_unfinished(auto_stack) == 0
    loads = auto_client.get_loads()
    assert [(load["num_running"], load["num_waiting"]) for load in loads] == [(0, 0)]
