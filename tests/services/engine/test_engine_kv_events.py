"""Engine.KvEvents without a network: every subscriber starts from a snapshot of the cached
hashes and then gets each batch the engine's steps produce, so two consumers (the router and
SubscribeKvEvents) never take each other's events."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from strand.engine_core.config import EngineArgs
from strand.engine_core.core.engine import EngineCore
from strand.engine_core.core.engine_io import EngineCoreRequest
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.common.convert import core_request_to_pb
from strand.services.engine.servicer import EngineServicer
from strand.services.router import prompt_block_hashes

BLOCK_SIZE = 16
PROMPT = list(range(100, 100 + 2 * BLOCK_SIZE + 1))  # two full blocks


class Span:
    def set_attribute(self, key: str, value: Any) -> None:
        pass


class Context:
    async def abort(self, code: Any, message: str) -> None:
        raise AssertionError(f"aborted: {code} {message}")


def _servicer(model_dir: Path, kv_events: bool) -> EngineServicer:
    import torch

    torch.set_num_threads(1)
    core = EngineCore.from_engine_args(EngineArgs(model=str(model_dir), kv_events=kv_events,
                                                  kv_cache_memory=8 * 1024**2))
    return EngineServicer(core, "tiny")


def _serve(servicer: EngineServicer, request_id: str) -> None:
    request = EngineCoreRequest(request_id, PROMPT, SamplingParams(temperature=0.0,
                                                                   max_tokens=1),
                                eos_token_id=None)
    servicer.calls.handle(epb.EngineRequest(add=epb.EngineAddRequests(
        requests=[core_request_to_pb(request)])), Span())
    servicer.calls.step(Span())


async def _next(stream: Any) -> epb.EngineKvEvents:
    return await asyncio.wait_for(anext(stream), 10)


def test_two_subscribers_each_get_every_batch_after_their_snapshot(tiny_model_dir: Path
                                                                   ) -> None:
    servicer = _servicer(tiny_model_dir, kv_events=True)
    hashes = prompt_block_hashes(PROMPT, BLOCK_SIZE)

    async def run() -> None:
        first = servicer.KvEvents(epb.EngineKvEventsRequest(), Context())  # type: ignore[arg-type]
        hello = await _next(first)
        assert hello.subscribed and list(hello.snapshot_block_hashes) == []
        # The step runs on the core's thread, as in the service.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(servicer._executor, _serve, servicer, "a")
        batch = (await _next(first)).batch
        assert batch.seq == hello.snapshot_next_seq
        stored = [h for e in batch.events for h in e.block_stored.block_hashes]
        assert stored == hashes
        # A later subscriber finds them in its snapshot, and both see the reset.
        second = servicer.KvEvents(epb.EngineKvEventsRequest(), Context())  # type: ignore[arg-type]
        hello2 = await _next(second)
        assert sorted(hello2.snapshot_block_hashes) == sorted(hashes)
        assert hello2.snapshot_next_seq == batch.seq + 1
        await loop.run_in_executor(servicer._executor, servicer.calls.handle, epb.EngineRequest(
            reset_prefix_cache=epb.EngineResetPrefixCache()), Span())
        for stream in (first, second):
            cleared = (await _next(stream)).batch
            assert cleared.seq == batch.seq + 1
            assert [e.WhichOneof("kind") for e in cleared.events] == ["all_blocks_cleared"]
            await stream.aclose()  # type: ignore[attr-defined]  # an async generator

    asyncio.run(run())
    servicer.close()


def test_an_engine_without_kv_events_refuses_the_subscription_naming_the_flag(
        tiny_model_dir: Path) -> None:
    servicer = _servicer(tiny_model_dir, kv_events=False)

    class Refusing:
        async def abort(self, code: Any, message: str) -> None:
            raise RuntimeError(f"{code.name}: {message}")

    async def run() -> None:
        stream = servicer.KvEvents(epb.EngineKvEventsRequest(), Refusing())  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="FAILED_PRECONDITION: kv_events.*--kv-events"):
            await anext(stream)

    asyncio.run(run())
    servicer.close()
