"""A request's gRPC deadline travels with it to the engine, which drops the request itself once
the deadline has passed: no cancel, no Abort call needed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import gateway_pb2_grpc
from strand.services.client import EngineClient
from strand.services.common.convert import params_to_pb, prompt_to_pb
from strand.services.launch import Stack
from tests.e2e.conftest import engine_num_unfinished, start_stack


def test_an_added_request_past_its_deadline_is_dropped_by_the_engine_alone(
        stack: Stack, client: EngineClient) -> None:
    # AddRequest returns once the request is in: nothing cancels it after that, so only the
    # deadline that travelled with it can end it.
    with grpc.insecure_channel(stack.gateway_address) as channel:
        gateway_pb2_grpc.GatewayStub(channel).AddRequest(gpb.AddRequestRequest(
            request_id="short-lived", prompt=prompt_to_pb("a request nobody waits for"),
            params=params_to_pb(SamplingParams(max_tokens=100, ignore_eos=True))),
            timeout=1.0, metadata=client._metadata())
    outputs = client.step()
    assert engine_num_unfinished(stack) == 1  # running until its deadline
    time.sleep(1.1)
    for _ in range(5):
        outputs += client.step()
        if any(o.finished for o in outputs):
            break
    final = [o for o in outputs if o.finished and isinstance(o, RequestOutput)]
    assert [(o.request_id, o.outputs[0].finish_reason) for o in final] == [
        ("short-lived", "abort")]
    assert engine_num_unfinished(stack) == 0
    assert client.reset_prefix_cache(reset_running_requests=False)


@pytest.fixture(scope="module")
def queue_bound_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[Stack]:
    # One request at a time, in auto mode: a second stream waits behind a long first one.
    with start_stack(tiny_model_dir, tmp_path_factory.mktemp("queue-bound-logs"),
                     ["--auto-step"], engine_args=["--max-num-seqs", "1",
                                                   "--max-queue-time", "0.3"]) as s:
        yield s


async def _long_then_queued(address: str) -> tuple[str, grpc.StatusCode, str]:
    # Long enough (seconds of steps) that the queued one outwaits the 0.3 s bound on any CPU.
    params = params_to_pb(SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True))
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        first = stub.Generate(gpb.GenerateRequest(
            request_id="long", prompt=prompt_to_pb("the one that runs"), params=params),
            timeout=120)
        await first.initial_metadata()
        second = stub.Generate(gpb.GenerateRequest(
            request_id="queued", prompt=prompt_to_pb("the one that waits"), params=params),
            timeout=120)
        try:
            async for _ in second:
                pass
            status, details = grpc.StatusCode.OK, ""
        except grpc.aio.AioRpcError as exc:
            status, details = exc.code(), exc.details() or ""
        last = None
        async for output in first:
            last = output
        assert last is not None
        return last.outputs[0].finish_reason, status, details


def test_a_request_queued_past_max_queue_time_is_refused_as_overload(
        queue_bound_stack: Stack) -> None:
    first_reason, status, details = asyncio.run(
        _long_then_queued(queue_bound_stack.gateway_address))
    assert first_reason == "length"  # the running request is not touched
    assert status == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max-queue-time" in details and "queued" in details
    assert engine_num_unfinished(queue_bound_stack) == 0
