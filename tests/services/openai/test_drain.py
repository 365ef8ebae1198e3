"""The front's drain: once draining, every request but /metrics is a 503 saying so; the count of
requests in flight covers a stream until its end; the server stops when none is left."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from strand.services.common.status import DRAINING_MESSAGE
from strand.services.openai.drain import Draining, DrainingServer, DrainState


def _app(state: DrainState, seen: list[int]) -> Draining:
    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def stream(request: Request) -> StreamingResponse:
        async def chunks() -> AsyncIterator[str]:
            for i in range(3):
                seen.append(state.num_in_flight)
                yield str(i)

        return StreamingResponse(chunks())

    return Draining(Starlette(routes=[Route("/health", ok), Route("/metrics", ok),
                                      Route("/stream", stream)]), state)


def test_a_draining_front_refuses_new_requests_with_a_503_saying_so() -> None:
    state = DrainState()
    with TestClient(_app(state, [])) as client:
        assert client.get("/health").status_code == 200
        state.draining = True
        resp = client.get("/health")
        assert resp.status_code == 503
        assert resp.json()["error"] == {"message": DRAINING_MESSAGE,
                                        "type": "service_unavailable_error", "param": None,
                                        "code": "service_unavailable"}
        assert client.get("/metrics").status_code == 200


def test_a_stream_is_in_flight_until_its_end() -> None:
    state, seen = DrainState(), list[int]()
    with TestClient(_app(state, seen)) as client:
        assert client.get("/stream").text == "012"
    assert seen == [1, 1, 1] and state.num_in_flight == 0


@pytest.mark.parametrize(("num_in_flight", "timeout_s", "stops"),
                         [(0, 60.0, True), (1, 60.0, False), (1, -10.0, True)])
def test_the_first_signal_drains_and_the_server_stops_when_none_is_left(
        num_in_flight: int, timeout_s: float, stops: bool) -> None:
    state = DrainState(num_in_flight=num_in_flight)
    server = DrainingServer(uvicorn.Config(_app(state, [])), state, timeout_s)
    server.handle_exit(signal.SIGTERM, None)
    assert state.draining and not server.should_exit
    assert asyncio.run(server.on_tick(1)) is stops


def test_a_second_signal_stops_at_once() -> None:
    state = DrainState(num_in_flight=1)
    server = DrainingServer(uvicorn.Config(_app(state, [])), state, 60.0)
    server.handle_exit(signal.SIGTERM, None)
    server.handle_exit(signal.SIGINT, None)
    assert server.should_exit
