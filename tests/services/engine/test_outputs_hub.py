"""The engine's output hub: a step's message offered without waiting when there is room, and the
engine's deliveries in step order whichever way each one goes in."""

from __future__ import annotations

import asyncio
from typing import Any

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.engine.outputs_hub import OutputsHub


def _msg(step: int) -> epb.EngineStepOutputs:
    return epb.EngineStepOutputs(step_id=step)


def test_an_offer_is_queued_while_there_is_room_and_refused_when_full() -> None:
    async def run() -> tuple[list[bool], list[int]]:
        hub = OutputsHub(on_lost=lambda: None, max_pending=2)
        stream = hub.stream()
        assert (await anext(stream)).subscribed
        offers = [hub.offer(_msg(i)) for i in (1, 2, 3)]
        seen = [(await anext(stream)).step_id for _ in range(2)]
        await stream.aclose()
        return offers, seen

    offers, seen = asyncio.run(run())
    assert offers == [True, True, False]  # the third waits for a put
    assert seen == [1, 2]


def test_without_a_subscriber_an_offer_is_taken_and_lost() -> None:
    lost: list[int] = []

    async def run() -> bool:
        hub = OutputsHub(on_lost=lambda: lost.append(1))
        return hub.offer(_msg(1))
    assert asyncio.run(run()) is True
    assert lost == []  # nothing was subscribed, so nothing was lost from a subscriber


def test_deliveries_keep_step_order_when_a_put_waits_for_room(tiny_model_dir: Any) -> None:
    """Five step messages delivered while the subscriber reads nothing: the first two go in at
    once, the rest wait in order behind a put, and the subscriber reads 1..5."""
    import torch

    from strand.engine_core.config import EngineArgs
    from strand.engine_core.core.engine import EngineCore
    from strand.services.engine.servicer import EngineServicer

    torch.set_num_threads(1)
    core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                  kv_cache_memory=8 * 1024**2))
    servicer = EngineServicer(core, "tiny", auto_step=True)

    async def run() -> tuple[int, list[int]]:
        stream = servicer.hub.stream()
        assert (await anext(stream)).subscribed
        for step in range(1, 6):
            servicer._deliver(_msg(step))
        waiting = len(servicer._deliveries)
        seen = [(await anext(stream)).step_id for _ in range(5)]
        while servicer._deliveries:
            await servicer._deliveries.popleft()
        await stream.aclose()
        return waiting, seen

    try:
        waiting, seen = asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        servicer.close()
    assert waiting == 3
    assert seen == [1, 2, 3, 4, 5]
    assert servicer._delivered == 5
