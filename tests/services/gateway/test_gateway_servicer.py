"""GatewayServicer.Generate against a scripted flow: a stream whose client is gone by the time
its add is answered is aborted, wherever the cancellation lands."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.gateway.servicer import GatewayServicer


class ScriptedFlow:
    """Adds every request at once (its internal id: "internal-" + its id); records aborts."""

    def __init__(self) -> None:
        self.control = None
        self.aborted: list[list[str]] = []

    async def add_request(self, client: str, request_id: str, *args: Any, **kwargs: Any) -> str:
        return f"internal-{request_id}"

    async def abort_internal(self, request_ids: list[str]) -> None:
        self.aborted.append(list(request_ids))


class GoneClient:
    """A call whose client left while its add was in the stages: grpc fails the first send
    (ExecuteBatchError for a cancelled call) or cancels the handler in it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def time_remaining(self) -> float | None:
        return None

    async def send_initial_metadata(self, metadata: Any) -> None:
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("the call is cancelled"),
                                   asyncio.CancelledError()])
def test_a_client_gone_before_the_initial_metadata_has_its_request_aborted(
        error: BaseException) -> None:
    """Issue 54: the send of the initial metadata was outside the stream's try/finally, so a
    request whose client left while it was being added ran on in the engine to its end."""
    flow = ScriptedFlow()
    servicer = GatewayServicer(cast(Any, flow))
    request = gpb.GenerateRequest(request_id="r", prompt=pb.Prompt(text="hi"),
                                  params=pb.SamplingParams(max_tokens=200))

    async def run() -> None:
        stream = servicer.Generate(request, cast(Any, GoneClient(error)))
        with pytest.raises(type(error)):
            await stream.__anext__()
        for _ in range(3):  # the abort runs in a task of its own
            await asyncio.sleep(0)
    asyncio.run(run())
    assert flow.aborted == [["internal-r"]]
