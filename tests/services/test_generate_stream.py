"""GenerateStreamSession against a scripted flow: outputs tagged per request, refusals that leave
the call open, cancels before and after the stages have a request, the call's early end aborting
what runs on it, and a reader that lags holding a bounded outbox while its outputs merge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry import context as otel_context

from services._proto.strand.v1 import gateway_pb2 as gpb
from services._proto.strand.v1 import inference_pb2 as ipb
from services._proto.strand.v1 import types_pb2 as pb
from services.common.status import StageError
from services.gateway.generate_stream import OUTBOX, GenerateStreamSession
from services.gateway.stream_outputs import StreamOutputs


class ScriptedFlow:
    """add_request and abort_internal as GatewayFlow's, the outputs put by the test."""

    def __init__(self) -> None:
        self.queues: dict[str, StreamOutputs] = {}
        self.aborted: list[str] = []
        self.admit = asyncio.Event()
        self.admit.set()
        self.refuse: dict[str, Exception] = {}

    async def add_request(self, client: str, public_id: str, prompt: Any, params: Any,
                          arrival_time: Any, priority: int, queue: StreamOutputs | None = None,
                          lora_request: Any = None) -> str:
        await self.admit.wait()
        if public_id in self.refuse:
            raise self.refuse[public_id]
        assert queue is not None
        self.queues[public_id] = queue
        return f"{client}/{public_id}"

    async def abort_internal(self, request_ids: list[str]) -> None:
        self.aborted.extend(request_ids)
        for rid in request_ids:
            public = rid.split("/", 1)[1]
            self.queues[public].put(_output(public, [], finish_reason="abort"))

    def emit(self, public_id: str, tokens: list[int], finish_reason: str | None = None) -> None:
        self.queues[public_id].put(_output(public_id, tokens, finish_reason))


def _output(rid: str, tokens: list[int], finish_reason: str | None = None) -> pb.RequestOutput:
    completion = pb.CompletionOutput(index=0, token_ids=tokens)
    if finish_reason is not None:
        completion.finish_reason = finish_reason
    return pb.RequestOutput(request_id=rid, outputs=[completion],
                            finished=finish_reason is not None)


def _generate(rid: str) -> ipb.GenerateStreamRequest:
    return ipb.GenerateStreamRequest(generate=gpb.GenerateRequest(
        request_id=rid, prompt=pb.Prompt(text="hi"),
        params=pb.SamplingParams(output_kind=pb.DELTA)))


class Caller:
    """One GenerateStream call: what the client sends, and what it has read. A pump pulls the
    call's responses as gRPC would, into `got`, while `flowing` is set."""

    def __init__(self, flow: ScriptedFlow, max_running: int = 1024) -> None:
        self.session = GenerateStreamSession(flow, "me", otel_context.Context(),  # type: ignore[arg-type]
                                             max_running=max_running)
        self.outgoing: asyncio.Queue[ipb.GenerateStreamRequest | None] = asyncio.Queue()
        self.got: asyncio.Queue[ipb.GenerateStreamResponse | None] = asyncio.Queue()
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.pump = asyncio.get_running_loop().create_task(self._pump())

    async def _requests(self) -> AsyncIterator[ipb.GenerateStreamRequest]:
        while (msg := await self.outgoing.get()) is not None:
            yield msg

    async def _pump(self) -> None:
        try:
            async for response in self.session.serve(self._requests()):
                self.got.put_nowait(response)
                await self.flowing.wait()
        finally:
            self.got.put_nowait(None)

    def send(self, msg: ipb.GenerateStreamRequest | None) -> None:
        self.outgoing.put_nowait(msg)

    async def read(self) -> ipb.GenerateStreamResponse:
        response = await asyncio.wait_for(self.got.get(), 5)
        assert response is not None, "the call ended"
        return response

    async def read_all(self) -> list[ipb.GenerateStreamResponse]:
        """Until the call ends."""
        responses = []
        while (response := await asyncio.wait_for(self.got.get(), 5)) is not None:
            responses.append(response)
        return responses


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_outputs_come_tagged_per_request_and_the_call_ends_after_the_last() -> None:
    async def run() -> None:
        flow = ScriptedFlow()
        caller = Caller(flow)
        caller.send(_generate("a"))
        caller.send(_generate("b"))
        await _settle()
        flow.emit("b", [1])
        assert (await caller.read()).output.request_id == "b"
        flow.emit("a", [2])
        flow.emit("b", [3], "length")
        caller.send(None)  # half-closed: the call goes on until "a" finishes too
        await _settle()
        flow.emit("a", [4], "stop")
        rest = await caller.read_all()
        assert [(r.output.request_id, list(r.output.outputs[0].token_ids), r.output.finished)
                for r in rest] == [("a", [2], False), ("b", [3], True), ("a", [4], True)]
        assert flow.aborted == []
    asyncio.run(run())


def test_refused_requests_are_answered_and_the_call_goes_on() -> None:
    async def run() -> None:
        flow = ScriptedFlow()
        flow.refuse["long"] = ValueError("the prompt is 900 tokens, over max_model_len 512")
        flow.refuse["busy"] = StageError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
        caller = Caller(flow, max_running=2)
        for rid in ("", "a", "a", "long", "busy"):
            caller.send(_generate(rid))
        refused = [(await caller.read()).refused for _ in range(4)]
        for rid in ("b", "c"):  # "a" and "b" run: "c" is one too many
            caller.send(_generate(rid))
        refused.append((await caller.read()).refused)
        codes = {r.request_id: grpc.StatusCode(_code(r.error.code)) for r in refused}
        assert codes == {"": grpc.StatusCode.INVALID_ARGUMENT,
                         "a": grpc.StatusCode.ALREADY_EXISTS,
                         "long": grpc.StatusCode.INVALID_ARGUMENT,
                         "busy": grpc.StatusCode.RESOURCE_EXHAUSTED,
                         "c": grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert "request_id is required" in refused[0].error.message
        assert "max_model_len 512" in next(r for r in refused if r.request_id == "long").error.message
        assert "at most 2 requests" in next(r for r in refused if r.request_id == "c").error.message
        # The two it took run on.
        flow.emit("a", [1], "length")
        flow.emit("b", [2], "length")
        caller.send(None)
        assert sorted(r.output.request_id for r in await caller.read_all()) == ["a", "b"]
    asyncio.run(run())


def _code(value: int) -> tuple[int, str]:
    return next(c.value for c in grpc.StatusCode if c.value[0] == value)


def test_cancel_aborts_one_request_before_or_after_the_stages_have_it() -> None:
    async def run() -> None:
        flow = ScriptedFlow()
        caller = Caller(flow)
        caller.send(_generate("a"))
        caller.send(_generate("b"))
        await _settle()
        caller.send(ipb.GenerateStreamRequest(cancel="a"))
        caller.send(ipb.GenerateStreamRequest(cancel="never-sent"))  # ignored
        first = await caller.read()
        assert (first.output.request_id, first.output.outputs[0].finish_reason) == ("a", "abort")
        assert flow.aborted == ["me/a"]
        # Cancelled while its add is on its way: aborted the moment the stages have it.
        flow.admit.clear()
        caller.send(_generate("c"))
        await _settle()
        caller.send(ipb.GenerateStreamRequest(cancel="c"))
        await _settle()
        assert flow.aborted == ["me/a"]
        flow.admit.set()
        ended = await caller.read()
        assert (ended.output.request_id, ended.output.outputs[0].finish_reason) == ("c", "abort")
        assert flow.aborted == ["me/a", "me/c"]
        flow.emit("b", [5], "length")
        caller.send(None)
        assert [r.output.request_id for r in await caller.read_all()] == ["b"]
    asyncio.run(run())


def test_a_call_that_ends_early_aborts_every_request_running_on_it() -> None:
    async def run() -> None:
        flow = ScriptedFlow()
        caller = Caller(flow)
        for rid in ("a", "b", "done"):
            caller.send(_generate(rid))
        await _settle()
        flow.emit("done", [1], "length")
        assert (await caller.read()).output.request_id == "done"
        caller.pump.cancel()  # the client went away: gRPC cancels the handler
        await _settle()
        assert sorted(flow.aborted) == ["me/a", "me/b"]
    asyncio.run(run())


def test_a_lagging_reader_holds_a_bounded_outbox_and_loses_nothing() -> None:
    async def run() -> None:
        flow = ScriptedFlow()
        caller = Caller(flow)
        caller.flowing.clear()  # the client reads one response, then nothing for a while
        caller.send(_generate("a"))
        await _settle()
        for token in range(500):
            flow.emit("a", [token])
            await asyncio.sleep(0)
        flow.emit("a", [500], "length")
        await _settle()
        assert caller.session._outbox.qsize() <= OUTBOX
        caller.send(None)
        caller.flowing.set()
        responses = await caller.read_all()
        # The one the client read, the outbox's, the one its copy task waits to put, and the
        # rest merged into one in the request's StreamOutputs.
        assert len(responses) == OUTBOX + 3
        tokens = [t for r in responses for t in r.output.outputs[0].token_ids]
        assert tokens == list(range(501))
        assert responses[-1].output.finished
    asyncio.run(run())


@pytest.mark.parametrize("rid", ["a"])
def test_an_unexpected_add_failure_is_refused_internal_and_the_call_goes_on(rid: str) -> None:
    async def run() -> None:
        flow = ScriptedFlow()
        flow.refuse[rid] = RuntimeError("boom")
        caller = Caller(flow)
        caller.send(_generate(rid))
        caller.send(_generate("b"))
        refused = (await caller.read()).refused
        assert (refused.request_id, _code(refused.error.code)[1]) == (rid, "internal")
        assert "boom" in refused.error.message
        flow.emit("b", [1], "length")
        caller.send(None)
        assert [r.output.request_id for r in await caller.read_all()] == ["b"]
    asyncio.run(run())
