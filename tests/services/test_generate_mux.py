"""GenerateMux against a scripted call: every waiting thread gets its own responses whichever
thread reads the call, the reading passes on when its reader is served, a broken call reaches
every request, and a cancelled request's later responses are dropped."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from services._proto.strand.v1 import gateway_pb2 as gpb
from services._proto.strand.v1 import inference_pb2 as ipb
from services._proto.strand.v1 import types_pb2 as pb
from services.generate_mux import GenerateMux, StreamError


class ScriptedCall:
    """The blocking GenerateStream call: responses the test feeds, requests recorded."""

    def __init__(self, requests: Iterator[ipb.GenerateStreamRequest]) -> None:
        self.feed: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.sent: list[ipb.GenerateStreamRequest] = []
        self.readers: set[str] = set()  # threads that have read the call
        self.cancelled = False
        threading.Thread(target=self._consume, args=(requests,), daemon=True).start()

    def _consume(self, requests: Iterator[ipb.GenerateStreamRequest]) -> None:
        for msg in requests:
            self.sent.append(msg)

    def __iter__(self) -> ScriptedCall:
        return self

    def __next__(self) -> ipb.GenerateStreamResponse:
        self.readers.add(threading.current_thread().name)
        item = self.feed.get()
        if item is StopIteration:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[no-any-return]

    def cancel(self) -> None:
        self.cancelled = True


class ScriptedStub:
    def __init__(self) -> None:
        self.call: ScriptedCall | None = None

    def GenerateStream(self, requests: Iterator[Any], metadata: Any) -> ScriptedCall:  # noqa: N802
        self.call = ScriptedCall(requests)
        return self.call


def _request(rid: str) -> gpb.GenerateRequest:
    return gpb.GenerateRequest(request_id=rid, prompt=pb.Prompt(text="hi"))


def _output(rid: str, token: int, finished: bool = False) -> ipb.GenerateStreamResponse:
    return ipb.GenerateStreamResponse(output=pb.RequestOutput(
        request_id=rid, outputs=[pb.CompletionOutput(index=0, token_ids=[token])],
        finished=finished))


def _mux() -> tuple[GenerateMux, ScriptedCall]:
    stub = ScriptedStub()
    mux = GenerateMux(stub, [])
    assert stub.call is not None
    return mux, stub.call


def _collect(mux: GenerateMux, rid: str, into: dict[str, Any]) -> None:
    inbox = mux.open(_request(rid), {})
    try:
        into[rid] = [(r.output.outputs[0].token_ids[0]) for r in mux.responses(rid, inbox)]
    except BaseException as exc:  # noqa: BLE001 - the test reads it
        into[rid] = exc


def _threads(mux: GenerateMux, rids: list[str], into: dict[str, Any]) -> list[threading.Thread]:
    threads = [threading.Thread(target=_collect, args=(mux, rid, into), name=rid, daemon=True)
               for rid in rids]
    for thread in threads:
        thread.start()
    return threads


def _join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive(), f"{thread.name} still waits"


def _wait_until(done: Any) -> None:
    deadline = time.monotonic() + 5
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _wait_sent(call: ScriptedCall, count: int) -> None:
    deadline = time.monotonic() + 5
    while len(call.sent) < count:
        assert time.monotonic() < deadline, "the requests were not sent"
        time.sleep(0.005)


def test_each_thread_gets_its_own_responses_whoever_reads_the_call() -> None:
    mux, call = _mux()
    got: dict[str, Any] = {}
    threads = _threads(mux, ["a", "b", "c"], got)
    _wait_sent(call, 3)
    _wait_until(lambda: len(mux._waiting) == 2)  # one thread reads, two wait on their inboxes
    (reader,) = call.readers
    # The reader's request ends first: the others' responses still to come, one of them reads.
    call.feed.put(_output(reader, 1, finished=True))
    for rid, token in (("c", 2), ("b", 3), ("c", 4), ("b", 5)):
        call.feed.put(_output(rid, token))
    for rid in ("c", "b", "a"):
        call.feed.put(_output(rid, 9, finished=True))
    _join(threads)
    expected = {"a": [9], "b": [3, 5, 9], "c": [2, 4, 9]}
    expected[reader] = [1]  # what came for it after its end is nobody's
    assert got == expected
    assert [m.generate.request_id for m in call.sent] == ["a", "b", "c"]
    assert len(call.readers) >= 2  # the reading passed on to a waiting thread


def test_a_lone_request_reads_the_call_on_its_own_thread() -> None:
    mux, call = _mux()
    got: dict[str, Any] = {}
    threads = _threads(mux, ["only"], got)
    _wait_sent(call, 1)
    call.feed.put(_output("only", 1, finished=True))
    _join(threads)
    assert got == {"only": [1]}
    assert call.readers == {"only"}  # no thread of the mux's own between the call and it


def test_a_broken_call_reaches_every_request_and_refuses_new_ones() -> None:
    mux, call = _mux()
    got: dict[str, Any] = {}
    threads = _threads(mux, ["a", "b"], got)
    _wait_sent(call, 2)
    call.feed.put(_output("a", 1))
    lost = StreamError(grpc.StatusCode.UNAVAILABLE, "gateway gone")
    call.feed.put(lost)
    _join(threads)
    assert got["a"] is lost and got["b"] is lost
    assert mux.broken is lost
    with pytest.raises(StreamError, match="gateway gone"):
        mux.open(_request("c"), {})


def test_the_call_ending_is_unavailable_for_what_ran_on_it() -> None:
    mux, call = _mux()
    got: dict[str, Any] = {}
    threads = _threads(mux, ["a"], got)
    _wait_sent(call, 1)
    call.feed.put(StopIteration)
    _join(threads)
    assert isinstance(got["a"], StreamError)
    assert got["a"].code() == grpc.StatusCode.UNAVAILABLE


def test_a_cancelled_request_is_sent_a_cancel_and_its_later_outputs_dropped() -> None:
    mux, call = _mux()
    inbox = mux.open(_request("x"), {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    mux.cancel("x")
    got: dict[str, Any] = {}
    threads = _threads(mux, ["y"], got)
    _wait_sent(call, 3)
    call.feed.put(_output("x", 1))  # on its way before the cancel arrived: nobody's now
    call.feed.put(_output("y", 2, finished=True))
    _join(threads)
    assert got == {"y": [2]}
    assert inbox.empty()
    kinds = [(m.WhichOneof("kind"), m.generate.request_id or m.cancel) for m in call.sent]
    assert kinds == [("generate", "x"), ("cancel", "x"), ("generate", "y")]
    assert call.sent[0].trace_context["traceparent"].startswith("00-111")


def test_a_refusal_ends_the_request_and_the_same_id_may_come_again() -> None:
    mux, call = _mux()
    inbox = mux.open(_request("r"), {})
    with pytest.raises(ValueError, match="already being generated"):
        mux.open(_request("r"), {})
    call.feed.put(ipb.GenerateStreamResponse(refused=ipb.GenerateRefused(
        request_id="r", error=pb.StageError(code=3, message="bad prompt"))))
    (response,) = list(mux.responses("r", inbox))
    error = StreamError.refused(response.refused.error)
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "bad prompt")
    mux.release("r")
    mux.open(_request("r"), {})
