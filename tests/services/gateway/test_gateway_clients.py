"""Requests belong to the client that added them, and what waits for a client's Step is bounded,
paged, and never lost: GatewayFlow against scripted stages."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from strand.services._proto.strand.v1 import detokenizer_pb2 as dpb
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.status import StageError
from strand.services.gateway.clients import (
    CLIENT_METADATA,
    client_identity,
    internal_id,
    output_bytes,
)
from strand.services.gateway.flow import GatewayFlow
from strand.services.gateway.stream_outputs import StreamOutputs
from tests.services.gateway.test_gateway_flow import FakeStage, SlowTokenizer, StepEngine, _output

PROMPT = pb.Prompt(text="x")
PARAMS = pb.SamplingParams()


def _stages(**flow_args: Any) -> tuple[GatewayFlow, StepEngine, FakeStage]:
    tokenizer = SlowTokenizer()
    tokenizer.release.set()
    engine, detokenizer = StepEngine(), FakeStage("detokenizer")
    flow = GatewayFlow(tokenizer, engine, detokenizer, **flow_args)  # type: ignore[arg-type]
    flow.auto_step = False

    async def subscribed(timeout: float) -> None:
        return None
    flow.feed.wait_subscribed = subscribed  # type: ignore[method-assign]
    engine.flow = flow
    return flow, engine, detokenizer


def _ids(outputs: list[pb.RequestOutput]) -> list[str]:
    return [o.request_id for o in outputs]


def test_step_returns_only_the_callers_outputs_and_keeps_the_others_for_their_owner() -> None:
    async def run() -> tuple[list[str], list[str], list[str]]:
        flow, engine, _ = _stages()
        await flow.add_request("alice", "r", PROMPT, PARAMS)
        await flow.add_request("bob", "r", PROMPT, PARAMS)  # the same id: another namespace
        engine.step_outputs = [[_output(internal_id("alice", "r"), 1),
                                _output(internal_id("bob", "r"), 2)]]
        alice, _, _ = await flow.step("alice")
        bob, _, _ = await flow.step("bob")  # nothing is live in bob's step but bob's own
        carol, _, _ = await flow.step("carol")
        return ([f"{o.request_id}{o.outputs[0].token_ids[0]}" for o in alice],
                [f"{o.request_id}{o.outputs[0].token_ids[0]}" for o in bob], _ids(carol))

    alice, bob, carol = asyncio.run(run())
    assert alice == ["r1"]
    assert bob == ["r2"]
    assert carol == []


def test_duplicates_and_aborts_only_see_the_callers_own_ids() -> None:
    async def run() -> tuple[StageError, StageError, int, list[Any]]:
        flow, _, detokenizer = _stages()
        await flow.add_request("alice", "secret-id", PROMPT, PARAMS)
        await flow.add_request("bob", "secret-id", PROMPT, PARAMS)  # no ALREADY_EXISTS
        with pytest.raises(StageError) as dup:
            await flow.add_request("bob", "secret-id", PROMPT, PARAMS)
        with pytest.raises(StageError) as other:
            await flow.abort("mallory", ["secret-id"])
        return dup.value, other.value, await flow.get_num_unfinished_requests("alice"), \
            detokenizer.sent

    dup, other, alice_running, sent = asyncio.run(run())
    assert dup.code == grpc.StatusCode.ALREADY_EXISTS
    assert other.code == grpc.StatusCode.NOT_FOUND and "secret-id" in other.message
    assert alice_running == 1  # mallory's abort touched nothing
    assert sent == []


def test_a_large_step_is_paged_and_every_output_arrives_in_order() -> None:
    async def run() -> tuple[list[list[int]], list[int], int]:
        flow, engine, _ = _stages()
        rid = internal_id("c", "big")
        await flow.add_request("c", "big", PROMPT, PARAMS)
        outputs = [_output(rid, t) for t in range(300)]
        engine.step_outputs = [outputs]
        page = 2048
        pages: list[list[int]] = []
        pending: list[int] = []
        for _ in range(50):
            got, _, num_pending = await flow.step("c", page)
            pages.append([o.outputs[0].token_ids[0] for o in got])
            pending.append(num_pending)
            assert sum(output_bytes(o) for o in got) + 16 <= page
            if num_pending == 0:
                break
        return pages, pending, engine.num_steps

    pages, pending, num_steps = asyncio.run(run())
    assert [t for p in pages for t in p] == list(range(300))  # all of them, in order
    assert len(pages) > 1 and all(pending[:-1]) and pending[-1] == 0
    # Paging out a backlog larger than a page does not step the engine; the Step whose owed
    # outputs all fit does (as any Step would).
    assert num_steps == 2 < len(pages)


def test_an_output_larger_than_any_page_ends_its_request_with_an_error() -> None:
    async def run() -> tuple[list[pb.RequestOutput], list[Any]]:
        flow, engine, detokenizer = _stages()
        rid = internal_id("c", "huge")
        await flow.add_request("c", "huge", PROMPT, PARAMS)
        huge = pb.RequestOutput(request_id=rid, outputs=[pb.CompletionOutput(
            index=0, token_ids=list(range(5000)))])
        engine.step_outputs = [[huge]]
        first, _, _ = await flow.step("c", 4096)
        await asyncio.sleep(0.01)  # the abort runs in the background
        return first + (await flow.step("c", 4096))[0], detokenizer.sent

    outputs, sent = asyncio.run(run())
    assert len(outputs) == 1 and outputs[0].finished
    assert outputs[0].outputs[0].finish_reason == "error"
    assert "exceeds the Step response limit of 4096 bytes" in outputs[0].error
    assert [list(m.abort.request_ids) for m in sent] == [[internal_id("c", "huge")]]


def test_outputs_beyond_the_bound_end_the_clients_requests_and_refuse_its_adds() -> None:
    async def run() -> tuple[list[pb.RequestOutput], StageError, int]:
        flow, _, _ = _stages(max_pending_outputs=10)
        for rid in ("a", "b"):
            await flow.add_request("idle", rid, PROMPT, PARAMS)
        await flow.add_request("busy", "c", PROMPT, PARAMS)
        # Auto-mode batches the idle client never collects.
        for t in range(6):
            flow._on_batch(dpb.OutputBatch(outputs=[
                _output(internal_id("idle", "a"), t), _output(internal_id("idle", "b"), t),
                _output(internal_id("busy", "c"), t)]))
        with pytest.raises(StageError) as refused:
            await flow.add_request("idle", "d", PROMPT, PARAMS)
        flow.auto_step = True
        owed: list[pb.RequestOutput] = []
        for _ in range(5):
            owed += (await flow.step("idle"))[0]
        return owed, refused.value, await flow.get_num_unfinished_requests("busy")

    owed, refused, busy_running = asyncio.run(run())
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Nothing delivered was dropped: the tokens before the bound, then each request's "error".
    tokens = [(o.request_id, o.outputs[0].token_ids[0]) for o in owed if not o.finished]
    assert sorted(tokens) == sorted((rid, t) for t in range(6) for rid in ("a", "b"))[:len(tokens)]
    assert len(tokens) >= 10
    ends = [o for o in owed if o.finished]
    assert sorted(o.request_id for o in ends) == ["a", "b"]
    assert all(o.outputs[0].finish_reason == "error" and "bound" in o.error for o in ends)
    assert busy_running == 1  # another client's request is untouched


def test_a_request_the_engine_lost_ends_with_an_error_and_self_steps_do_not_spin() -> None:
    async def run() -> tuple[list[pb.RequestOutput | None], int]:
        flow, engine, _ = _stages(self_step_after=0.05)
        engine.num_unfinished = 0  # the engine holds nothing (removed behind our back)
        queue = StreamOutputs(aggregate=True)
        await flow.add_request("c", "gone", PROMPT, PARAMS, queue=queue)
        await flow.add_request("c", "adding", PROMPT, PARAMS, queue=StreamOutputs(aggregate=True))
        flow._live[internal_id("c", "adding")].child_ids = []  # its add still in flight
        flow.start()
        last = await asyncio.wait_for(queue.get(), 5)
        await asyncio.sleep(0.5)
        await flow.close()
        return [last], engine.num_steps

    (last,), num_steps = asyncio.run(run())
    assert last is not None and last.finished and last.request_id == "gone"
    assert last.outputs[0].finish_reason == "error"
    assert "no longer holds" in last.error
    # One stream is still waiting for its add: the idle engine is stepped once per
    # self_step_after, not in a busy loop (thousands of steps in 0.5 s before).
    assert num_steps <= 15


def test_client_identity_follows_the_label_the_key_or_the_connection() -> None:
    assert client_identity([(CLIENT_METADATA, "front-1")], "ipv4:1", False) == "label/front-1"
    assert client_identity([(CLIENT_METADATA, "front-1")], "ipv4:1", True) == "key/front-1"
    assert client_identity([], "ipv4:127.0.0.1:5", True) == "key"
    assert client_identity([], "ipv4:127.0.0.1:5", False) == "peer/ipv4:127.0.0.1:5"
    with pytest.raises(StageError) as bad:
        client_identity([(CLIENT_METADATA, "x" * 200)], "p", False)
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert CLIENT_METADATA in bad.value.message and "128" in bad.value.message


class QueryEngine(StepEngine):
    """Auto mode's engine: it answers queries, holding only the ids in `held`."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()

    async def answer(self, msg: Any) -> Any:
        if msg.WhichOneof("kind") == "query":
            return epb.EngineResponse(state=epb.EngineState(missing_request_ids=[
                r for r in msg.query.request_ids if r not in self.held]))
        return await super().answer(msg)


def test_a_request_removed_from_the_engine_in_auto_mode_ends_with_an_error() -> None:
    async def run() -> tuple[pb.RequestOutput | None, int]:
        tokenizer = SlowTokenizer()
        tokenizer.release.set()
        engine = QueryEngine()
        flow = GatewayFlow(tokenizer, engine, FakeStage("detokenizer"),  # type: ignore[arg-type]
                           reconcile_every=0.05)
        flow.auto_step = True

        async def subscribed(timeout: float) -> None:
            return None
        flow.feed.wait_subscribed = subscribed  # type: ignore[method-assign]
        gone = StreamOutputs(aggregate=True)
        kept = StreamOutputs(aggregate=True)
        await flow.add_request("c", "gone", PROMPT, PARAMS, queue=gone)
        await flow.add_request("c", "kept", PROMPT, PARAMS, queue=kept)
        engine.held = {internal_id("c", "kept")}  # "gone" was aborted past the gateway
        task = asyncio.get_running_loop().create_task(flow.reconciler.run())
        last = await asyncio.wait_for(gone.get(), 5)
        await asyncio.sleep(0.3)  # more rounds: the held request is left alone
        task.cancel()
        return last, await flow.get_num_unfinished_requests("c")

    last, running = asyncio.run(run())
    assert last is not None and last.finished and last.request_id == "gone"
    assert last.outputs[0].finish_reason == "error" and "no longer holds" in last.error
    assert running == 1
