"""The local link between stages: the same handlers and answers as gRPC, the same stage token,
size limit and status codes, and the handler cancelled when its caller goes away."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import engine_pb2_grpc
from strand.services.common import link_server
from strand.services.common.link_call import LinkCall, LinkRpcError
from strand.services.common.link_frames import Kind, link_address, write_frame
from strand.services.common.link_server import LinkRegistry, LinkServer
from strand.services.common.server import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS
from strand.services.common.stage_client import StageClient
from strand.services.common.stage_link import TRANSPORT_ENV, TRANSPORTS, link_port, stream_method
from strand.services.common.status import StageError, StageUnavailable
from strand.services.common.subscriber import Subscriber
from strand.services.launch import StackConfig, launch_stack

TOKEN = "link-test-token"


class EchoEngine(engine_pb2_grpc.EngineServicer):
    """Session answers each message with its seq; Outputs streams three steps; KvEvents is
    refused as an engine without --kv-events refuses it."""

    def __init__(self) -> None:
        self.sessions_ended = asyncio.Event()
        self.seqs: list[int] = []  # the Session messages in the order they came

    async def Session(self, request_iterator: AsyncIterator[epb.EngineRequest],
                      context: Any) -> AsyncIterator[epb.EngineResponse]:
        try:
            async for msg in request_iterator:
                self.seqs.append(msg.seq)
                yield epb.EngineResponse(seq=msg.seq)
        finally:
            self.sessions_ended.set()

    async def Outputs(self, request: epb.EngineOutputsRequest,
                      context: Any) -> AsyncIterator[epb.EngineStepOutputs]:
        for step in range(1, 4):
            yield epb.EngineStepOutputs(step_id=step)

    async def KvEvents(self, request: epb.EngineKvEventsRequest,
                       context: Any) -> AsyncIterator[epb.EngineKvEvents]:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "kv_events must be on")
        yield epb.EngineKvEvents()  # pragma: no cover


@dataclass
class _Stage:
    """An engine-like stage on 127.0.0.1: gRPC, and the link unless told not to."""

    address: str
    servicer: EchoEngine
    server: grpc.aio.Server
    link: LinkServer

    async def stop(self) -> None:
        await self.link.close()  # every linked stream of the stage ends at once
        await self.server.stop(None)


async def _start_stage(link: bool = True, max_message_bytes: int = 1 << 20) -> _Stage:
    servicer = EchoEngine()
    server = grpc.aio.server()
    registry = LinkRegistry(server)
    engine_pb2_grpc.add_EngineServicer_to_server(servicer, registry)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    linked = LinkServer("engine", registry.handlers if link else {}, TOKEN, max_message_bytes)
    await linked.start(port)
    return _Stage(f"127.0.0.1:{port}", servicer, server, linked)


async def _with_stage(body: Callable[[str, EchoEngine], Awaitable[None]], *, link: bool = True,
                      max_message_bytes: int = 1 << 20) -> None:
    stage = await _start_stage(link, max_message_bytes)
    try:
        await body(stage.address, stage.servicer)
    finally:
        await stage.stop()


@pytest.fixture(autouse=True)
def _stage_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAND_STAGE_TOKEN", TOKEN)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test that takes it runs on the link ("auto") and on gRPC."""
    monkeypatch.setenv(TRANSPORT_ENV, request.param)
    return str(request.param)


def test_only_streaming_methods_are_linked() -> None:
    async def register() -> list[str]:
        registry = LinkRegistry(grpc.aio.server())
        engine_pb2_grpc.add_EngineServicer_to_server(EchoEngine(), registry)  # type: ignore[arg-type]
        return sorted(registry.handlers)
    assert asyncio.run(register()) == ["/strand.v1.Engine/KvEvents", "/strand.v1.Engine/Outputs",
                                       "/strand.v1.Engine/Session"]  # GetInfo is unary


def test_session_and_subscription_answer_alike_on_either_transport(transport: str) -> None:

    async def body(address: str, servicer: EchoEngine) -> None:
        client = StageClient("engine", address, engine_pb2_grpc.EngineStub)
        try:
            answers = await asyncio.gather(*(client.call(epb.EngineRequest(query=epb.EngineQuery()))
                                             for _ in range(5)))
            assert sorted(a.seq for a in answers) == [1, 2, 3, 4, 5]
            assert isinstance(client._call, LinkCall) == (transport == "auto")
            path, answer_type = stream_method("engine", "Outputs")
            call = await client.open_stream(path, answer_type, epb.EngineOutputsRequest())
            assert [m.step_id async for m in call] == [1, 2, 3]
        finally:
            await client.close()
    asyncio.run(_with_stage(body))


def test_linked_calls_are_written_in_their_callers_turn_and_arrive_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the stream is open, a call's frame goes into the socket in the caller's own turn
    (no write task), unless an earlier write still waits for room: then it queues behind it.
    Large messages fill the socket so that both ways are taken; the stage sees every message in
    the order of the calls."""
    monkeypatch.setenv(TRANSPORT_ENV, "auto")
    big = [f"request-{i:06d}" for i in range(2000)]  # ~30 KB a message

    async def body(address: str, servicer: EchoEngine) -> None:
        client = StageClient("engine", address, engine_pb2_grpc.EngineStub)
        tasks = 0
        write = client._write

        async def counted(msg: Any) -> None:
            nonlocal tasks
            tasks += 1
            await write(msg)
        client._write = counted  # type: ignore[method-assign]
        try:
            await client.call(epb.EngineRequest(query=epb.EngineQuery()))  # opens the stream
            assert tasks == 1
            assert (await client.call(epb.EngineRequest(query=epb.EngineQuery()))).seq == 2
            assert tasks == 1  # written in the call's own turn
            # A write that had to wait (the socket full, here once by fiat): the call after it
            # queues behind it even if the socket has room by then.
            link = client._call
            send_now = link.send_now
            refused: list[Any] = []

            def refuse_once(msg: Any) -> bool:
                if not refused:
                    refused.append(msg)
                    return False
                return bool(send_now(msg))
            link.send_now = refuse_once
            await asyncio.gather(*(client.call(epb.EngineRequest(query=epb.EngineQuery()))
                                   for _ in range(2)))
            link.send_now = send_now
            assert tasks == 3 and servicer.seqs == [1, 2, 3, 4]
            answers = await asyncio.gather(*(client.call(epb.EngineRequest(
                query=epb.EngineQuery(request_ids=big))) for _ in range(200)))
            assert sorted(a.seq for a in answers) == list(range(5, 205))
            assert 3 < tasks < 203  # some waited for room, some went at once
            assert servicer.seqs == list(range(1, 205))
        finally:
            await client.close()
    asyncio.run(_with_stage(body, max_message_bytes=1 << 20))


def test_send_writes_in_the_callers_turn_and_answers_in_its_task(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """StageClient.send: the frame goes out before the caller's next await (where the link
    lets it), the answer comes out of the task; a refusal comes out of the task too."""
    monkeypatch.setenv(TRANSPORT_ENV, "auto")

    async def body(address: str, servicer: EchoEngine) -> None:
        client = StageClient("engine", address, engine_pb2_grpc.EngineStub)
        try:
            await client.call(epb.EngineRequest(query=epb.EngineQuery()))  # opens the stream
            link = client._call
            written: list[int] = []
            send_now = link.send_now

            def recording(msg: Any) -> bool:
                written.append(msg.seq)
                return bool(send_now(msg))
            link.send_now = recording
            task = client.send(epb.EngineRequest(query=epb.EngineQuery()))
            assert written == [2]  # before this coroutine gave up its turn
            assert (await task).seq == 2
            await client.close()
            refused = client.send(epb.EngineRequest(query=epb.EngineQuery()))
            with pytest.raises(StageUnavailable, match="shutting down"):
                await refused
        finally:
            await client.close()
    asyncio.run(_with_stage(body))


def test_an_abort_in_the_handler_reaches_the_caller_with_its_code(transport: str) -> None:

    async def body(address: str, servicer: EchoEngine) -> None:
        client = StageClient("engine", address, engine_pb2_grpc.EngineStub)
        try:
            call = await client.open_stream(*stream_method("engine", "KvEvents"),
                                            epb.EngineKvEventsRequest())
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert err.value.details() == "kv_events must be on"
        finally:
            await client.close()
    asyncio.run(_with_stage(body))


def test_a_stage_without_a_link_is_reached_over_grpc() -> None:
    async def body(address: str, servicer: EchoEngine) -> None:
        client = StageClient("engine", address, engine_pb2_grpc.EngineStub)
        try:
            answer = await client.call(epb.EngineRequest(query=epb.EngineQuery()))
            assert answer.seq == 1
            assert not isinstance(client._call, LinkCall)
        finally:
            await client.close()
    asyncio.run(_with_stage(body, link=False))


async def _raw_stream(address: str, method: str, authorization: str,
                      frames: list[tuple[Kind, bytes]] = ()) -> LinkRpcError:  # type: ignore[assignment]
    """Open `method` with this authorization, send `frames`, and return how the stage ended
    the stream."""
    port = link_port(address)
    assert port is not None
    call = await LinkCall.open(port, method, authorization, epb.EngineResponse, None, 1 << 20, 1.0)
    for kind, payload in frames:
        write_frame(call._writer, kind, payload)
    with pytest.raises(LinkRpcError) as err:
        while True:
            await asyncio.wait_for(call.read(), 5)
    return err.value


@pytest.mark.parametrize("authorization", ["", "Bearer wrong", "Bearer ключ"])
def test_the_link_requires_the_stage_token(authorization: str) -> None:
    async def body(address: str, servicer: EchoEngine) -> None:
        error = await _raw_stream(address, "/strand.v1.Engine/Session", authorization)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "api key" in (error.details() or "")
    asyncio.run(_with_stage(body))


def test_a_stage_serves_a_bounded_number_of_linked_streams(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link_server, "MAX_STREAMS", 1)

    async def body(address: str, servicer: EchoEngine) -> None:
        client = StageClient("engine", address, engine_pb2_grpc.EngineStub)
        try:
            await client.call(epb.EngineRequest(query=epb.EngineQuery()))  # the one stream
            error = await _raw_stream(address, "/strand.v1.Engine/Session", f"Bearer {TOKEN}")
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "at most 1 linked streams" in (error.details() or "")
        finally:
            await client.close()
    asyncio.run(_with_stage(body))


def test_a_stage_whose_loop_is_held_a_few_seconds_keeps_its_link() -> None:
    """Longer than gRPC's keepalive timeout, shorter than the link's: not a frozen stage."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ready: concurrent.futures.Future[str] = concurrent.futures.Future()
    release = asyncio.Event()

    async def serve() -> None:
        await _with_stage(lambda address, servicer: _serve_until(address, ready, release))

    serving = asyncio.run_coroutine_threadsafe(serve(), loop)
    address = ready.result(10)

    async def call_across_a_held_loop() -> None:
        client = StageClient("engine", address, engine_pb2_grpc.EngineStub)
        try:
            await client.call(epb.EngineRequest(query=epb.EngineQuery()))
            linked = client._call
            assert isinstance(linked, LinkCall)
            hold = KEEPALIVE_TIME_MS / 1000 + KEEPALIVE_TIMEOUT_MS / 1000 + 0.5
            loop.call_soon_threadsafe(time.sleep, hold)  # the stage's loop answers nothing
            await asyncio.sleep(0.1)
            answer = await client.call(epb.EngineRequest(query=epb.EngineQuery()))
            assert answer.seq == 2 and client._call is linked  # the same stream
        finally:
            await client.close()
    try:
        asyncio.run(call_across_a_held_loop())
    finally:
        loop.call_soon_threadsafe(release.set)
        serving.result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


async def _serve_until(address: str, ready: concurrent.futures.Future[str],
                       release: asyncio.Event) -> None:
    ready.set_result(address)
    await release.wait()


def test_an_unknown_method_is_unimplemented() -> None:
    async def body(address: str, servicer: EchoEngine) -> None:
        error = await _raw_stream(address, "/strand.v1.Engine/GetInfo", f"Bearer {TOKEN}")
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "GetInfo" in (error.details() or "")
    asyncio.run(_with_stage(body))


def test_a_message_over_the_limit_is_refused_before_it_is_read() -> None:
    async def body(address: str, servicer: EchoEngine) -> None:
        big = epb.EngineRequest(seq=1, abort=epb.EngineAbort(request_ids=["x" * 5000]))
        error = await _raw_stream(address, "/strand.v1.Engine/Session", f"Bearer {TOKEN}",
                                  [(Kind.MESSAGE, big.SerializeToString())])
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over the 4096-byte limit" in (error.details() or "")
    asyncio.run(_with_stage(body, max_message_bytes=4096))


def test_an_undecodable_message_ends_the_stream_as_invalid_argument() -> None:
    async def body(address: str, servicer: EchoEngine) -> None:
        error = await _raw_stream(address, "/strand.v1.Engine/Session", f"Bearer {TOKEN}",
                                  [(Kind.MESSAGE, b"\xff\xff\xff")])
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "undecodable" in (error.details() or "")
    asyncio.run(_with_stage(body))


def test_a_caller_that_goes_away_cancels_its_handler() -> None:
    async def body(address: str, servicer: EchoEngine) -> None:
        client = StageClient("engine", address, engine_pb2_grpc.EngineStub)
        await client.call(epb.EngineRequest(query=epb.EngineQuery()))
        assert isinstance(client._call, LinkCall)
        assert not servicer.sessions_ended.is_set()
        await client.close()
        await asyncio.wait_for(servicer.sessions_ended.wait(), 5)
    asyncio.run(_with_stage(body))


def _client_told_of_losses(address: str) -> tuple[StageClient, list[str]]:
    """A client to the stage, and the list its on_lost fills."""
    lost: list[str] = []

    async def on_lost(error: StageError) -> None:
        lost.append(error.message)
    return StageClient("engine", address, engine_pb2_grpc.EngineStub, on_lost=on_lost), lost


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)


def test_a_stage_that_goes_away_fails_the_pending_call_as_unavailable() -> None:
    async def run() -> None:
        stage = await _start_stage()
        client, lost = _client_told_of_losses(stage.address)
        try:
            await client.call(epb.EngineRequest(query=epb.EngineQuery()))
            await stage.stop()
            await _until(lambda: bool(lost))
            assert lost[0].startswith("engine stage is unavailable")
            with pytest.raises(StageError) as err:
                await client.call(epb.EngineRequest(query=epb.EngineQuery()))
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
        finally:
            await client.close()
    asyncio.run(run())


@pytest.mark.parametrize(("target", "port"), [("127.0.0.1:5000", 5000), ("localhost:5001", 5001),
                                              ("[::1]:5002", 5002), ("10.0.0.7:5003", None),
                                              ("engine:5004", None), ("0.0.0.0:5005", 5005)])
def test_only_stages_on_this_host_are_linked(target: str, port: int | None) -> None:
    assert link_port(target) == port


def test_the_transport_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "grpc")
    assert link_port("127.0.0.1:5000") is None
    monkeypatch.setenv(TRANSPORT_ENV, "zmq")
    with pytest.raises(ValueError, match=f"{TRANSPORT_ENV} must be one of auto, grpc"):
        link_port("127.0.0.1:5000")


def test_link_names_follow_the_port() -> None:
    assert link_address(5000) == "\0strand-stage-5000"


class _Steps(Subscriber):
    """Follows the stage's Outputs; the first step after each subscription raises."""

    method = "Outputs"

    def __init__(self, client: StageClient) -> None:
        super().__init__(client)
        self.steps: list[int] = []
        self.lost: list[str] = []

    def request(self) -> epb.EngineOutputsRequest:
        return epb.EngineOutputsRequest()

    async def on_message(self, msg: epb.EngineStepOutputs) -> None:
        self.steps.append(msg.step_id)
        if len(self.steps) == 1:
            raise RuntimeError("a bug in the stage's handling")

    def on_lost(self, detail: str, was_subscribed: bool) -> None:
        self.lost.append(detail)


def test_a_subscription_whose_handler_fails_is_lost_and_opened_again() -> None:
    async def body(address: str, servicer: EchoEngine) -> None:
        follower = _Steps(StageClient("engine", address, engine_pb2_grpc.EngineStub))
        follower.start()
        try:
            for _ in range(50):
                if len(follower.steps) >= 4:
                    break
                await asyncio.sleep(0.05)
        finally:
            await follower.close()
            await follower.client.close()
        # The fault ended the first subscription (told, with what it was); the next one read on.
        assert follower.lost[0] == "RuntimeError: a bug in the stage's handling"
        assert follower.steps[:4] == [1, 1, 2, 3]
    asyncio.run(_with_stage(body))


def test_a_stopping_stage_gives_its_open_streams_a_grace() -> None:
    async def run() -> None:
        stage = await _start_stage()
        client, lost = _client_told_of_losses(stage.address)
        try:
            await client.call(epb.EngineRequest(query=epb.EngineQuery()))
            closing = asyncio.ensure_future(stage.link.close(grace=1.0))
            await asyncio.sleep(0.2)
            # Within the grace the open stream still answers; then it is ended.
            assert (await client.call(epb.EngineRequest(query=epb.EngineQuery()))).seq == 2
            assert not lost
            await asyncio.wait_for(closing, 5)
            await _until(lambda: bool(lost))
            assert lost[0].startswith("engine stage is unavailable")
        finally:
            await client.close()
            await stage.server.stop(None)
    asyncio.run(run())


def test_a_stack_with_a_bad_transport_setting_is_refused_before_any_stage_starts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "zmq")
    with pytest.raises(ValueError, match=f"{TRANSPORT_ENV} must be one of auto, grpc, got 'zmq'"):
        launch_stack(StackConfig(model=str(tmp_path)))
