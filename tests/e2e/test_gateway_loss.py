"""A gateway that dies leaves nothing behind: its stage sessions end and the stages release the
requests it had added (the shared stack's own gateway is unaffected)."""

from __future__ import annotations

import time

from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from strand.services.launch import Stack
from tests.e2e.conftest import engine_num_unfinished, start_side_gateway


def test_requests_of_a_killed_gateway_are_released_by_the_stages(stack: Stack,
                                                                 client: EngineClient) -> None:
    process, address = start_side_gateway(stack)
    try:
        with EngineClient(address, timeout=30) as side:
            side.add_request("orphan-1", "left behind", SamplingParams(max_tokens=100))
            side.add_request("orphan-2", "left behind", SamplingParams(max_tokens=100))
            assert engine_num_unfinished(stack) == 2
    finally:
        process.kill()
        process.wait(timeout=15)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (engine_num_unfinished(stack)
                                           or client.get_num_unfinished_requests()):
        time.sleep(0.05)
    assert engine_num_unfinished(stack) == 0
    assert client.get_num_unfinished_requests() == 0
