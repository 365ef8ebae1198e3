"""Engine.KvEvents without a network: every subscriber starts from a snapshot of the cached
hashes and then gets each batch the engine's steps produce, so two consumers (the router and
SubscribeKvEvents) never take each other's events; one that resumes gets exactly the batches
it missed, or a snapshot when they are no longer kept."""

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
from strand.services.engine import kv_events_hub
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


def _serve(servicer: EngineServicer, request_id: str, prompt: list[int] = PROMPT) -> None:
    request = EngineCoreRequest(request_id, prompt, SamplingParams(temperature=0.0,
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


OTHER = list(range(300, 300 + 2 * BLOCK_SIZE + 1))  # two other full blocks


def _subscribe(servicer: EngineServicer, start_seq: int | None = None, epoch: str = ""
               ) -> Any:
    request = epb.EngineKvEventsRequest(start_seq=start_seq, epoch=epoch)
    return servicer.KvEvents(request, Context())  # type: ignore[arg-type]


async def _run_on_core(servicer: EngineServicer, fn: Any, *args: Any) -> None:
    await asyncio.get_running_loop().run_in_executor(servicer._executor, fn, *args)


def test_a_subscriber_resuming_inside_the_buffer_gets_exactly_the_missed_batches(
        tiny_model_dir: Path) -> None:
    servicer = _servicer(tiny_model_dir, kv_events=True)

    async def run() -> None:
        watcher = _subscribe(servicer)  # keeps every batch flowing while the other is away
        await _next(watcher)
        leaving = _subscribe(servicer)
        hello = await _next(leaving)
        await _run_on_core(servicer, _serve, servicer, "a")
        seen = (await _next(leaving)).batch
        assert (await _next(watcher)).batch == seen
        await leaving.aclose()
        await _run_on_core(servicer, _serve, servicer, "b", OTHER)
        await _run_on_core(servicer, servicer.calls.handle, epb.EngineRequest(
            reset_prefix_cache=epb.EngineResetPrefixCache()), Span())
        missed = [(await _next(watcher)).batch for _ in range(2)]
        assert [b.seq for b in missed] == [seen.seq + 1, seen.seq + 2]

        back = _subscribe(servicer, seen.seq + 1, hello.epoch)
        resumed = await _next(back)
        assert resumed.subscribed and resumed.resumed and resumed.epoch == hello.epoch
        assert list(resumed.snapshot_block_hashes) == []
        assert [(await _next(back)).batch for _ in range(2)] == missed
        with pytest.raises(TimeoutError):  # nothing twice
            await asyncio.wait_for(anext(back), 0.5)
        for stream in (watcher, back):
            await stream.aclose()

    asyncio.run(run())
    servicer.close()


def test_a_subscriber_resuming_too_far_back_or_from_another_epoch_gets_a_snapshot(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_events_hub, "REPLAY_BATCHES", 1)
    servicer = _servicer(tiny_model_dir, kv_events=True)
    cached = prompt_block_hashes(PROMPT, BLOCK_SIZE) + prompt_block_hashes(OTHER, BLOCK_SIZE)

    async def run() -> None:
        watcher = _subscribe(servicer)
        hello = await _next(watcher)
        await _run_on_core(servicer, _serve, servicer, "a")
        first = (await _next(watcher)).batch
        await _run_on_core(servicer, _serve, servicer, "b", OTHER)
        last = (await _next(watcher)).batch
        assert first.epoch == last.epoch == hello.epoch
        for start_seq, epoch in ((first.seq, hello.epoch),  # dropped from the buffer
                                 (last.seq, "an-engine-that-restarted")):
            stream = _subscribe(servicer, start_seq, epoch)
            marker = await _next(stream)
            assert marker.subscribed and not marker.resumed and marker.epoch == hello.epoch
            assert sorted(marker.snapshot_block_hashes) == sorted(cached)
            assert marker.snapshot_next_seq == last.seq + 1
            await stream.aclose()
        await watcher.aclose()

    asyncio.run(run())
    servicer.close()


def test_each_engine_start_is_a_new_epoch(tiny_model_dir: Path) -> None:
    first, second = (_servicer(tiny_model_dir, kv_events=True) for _ in range(2))
    assert first.kv_hub.epoch and first.kv_hub.epoch != second.kv_hub.epoch
    for servicer in (first, second):
        servicer.close()
