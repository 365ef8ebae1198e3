"""GatewayFlow and the detokenizer's routes against scripted stages: a Step returns exactly its
own step's outputs, other outputs wait for the next Step, and an add cancelled half-way is
aborted once the stages have it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from strand.services._proto.strand.v1 import detokenizer_pb2 as dpb
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import tokenizer_pb2 as tpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.detokenizer.routes import Routes
from strand.services.gateway.clients import internal_id
from strand.services.gateway.flow import GatewayFlow
from strand.services.gateway.stream_outputs import StreamOutputs


class FakeStage:
    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.target = f"{stage}:0"
        self.sent: list[Any] = []
        self.stub: Any = None
        self.channel: Any = None

    async def call(self, msg: Any) -> Any:
        self.sent.append(msg)
        return await self.answer(msg)

    def send(self, msg: Any) -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(self.call(msg))

    async def answer(self, msg: Any) -> Any:
        return None

    async def close(self) -> None:
        pass


class SlowTokenizer(FakeStage):
    def __init__(self) -> None:
        super().__init__("tokenizer")
        self.release = asyncio.Event()

    async def answer(self, msg: Any) -> Any:
        await self.release.wait()
        return tpb.TokenizerResponse(added=tpb.AddedRequest(
            child_ids=[msg.process.request_id], num_prompt_tokens=3))


class StepEngine(FakeStage):
    """Each step's outputs come back through `flow` as the detokenizer would send them."""

    def __init__(self) -> None:
        super().__init__("engine")
        self.flow: GatewayFlow | None = None
        self.step_outputs: list[list[pb.RequestOutput]] = []
        self.num_unfinished = 1  # what the engine reports holding after each step
        self.num_steps = 0

    async def answer(self, msg: Any) -> Any:
        assert self.flow is not None
        if msg.WhichOneof("kind") == "step":
            self.num_steps += 1
            outputs = self.step_outputs.pop(0) if self.step_outputs else []
            # Another gateway-less output first (untagged), then this step's batch.
            self.flow._on_batch(dpb.OutputBatch(step_id=msg.step.step_id, outputs=outputs))
        return epb.EngineResponse(state=epb.EngineState(
            num_unfinished_requests=self.num_unfinished))


def _output(request_id: str, token: int, finished: bool = False) -> pb.RequestOutput:
    completion = pb.CompletionOutput(index=0, token_ids=[token])
    if finished:
        completion.finish_reason = "length"
    return pb.RequestOutput(request_id=request_id, outputs=[completion], finished=finished)


def _flow(tokenizer: FakeStage, engine: FakeStage, detokenizer: FakeStage) -> GatewayFlow:
    flow = GatewayFlow(tokenizer, engine, detokenizer)  # type: ignore[arg-type]
    flow.auto_step = False

    async def subscribed(timeout: float) -> None:
        return None
    flow.feed.wait_subscribed = subscribed  # type: ignore[method-assign]
    return flow


def test_step_returns_its_own_step_outputs_and_owes_the_rest_to_the_next() -> None:
    async def run() -> tuple[list[str], list[str]]:
        tokenizer = SlowTokenizer()
        tokenizer.release.set()
        engine = StepEngine()
        flow = _flow(tokenizer, engine, FakeStage("detokenizer"))
        engine.flow = flow
        for rid in ("a", "b"):
            await flow.add_request("me", rid, pb.Prompt(text="x"), pb.SamplingParams())
        # A self-step of this gateway (untagged) reported b's first token meanwhile.
        flow._on_batch(dpb.OutputBatch(step_id=0, outputs=[_output(internal_id("me", "b"), 5)]))
        a, b = internal_id("me", "a"), internal_id("me", "b")
        engine.step_outputs = [[_output(a, 1), _output(b, 2, finished=True)],
                               [_output(a, 3, finished=True)]]
        first, _, _ = await flow.step("me")
        second, _, _ = await flow.step("me")
        return ([f"{o.request_id}{o.outputs[0].token_ids[0]}" for o in first],
                [f"{o.request_id}{o.outputs[0].token_ids[0]}" for o in second])

    first, second = asyncio.run(run())
    assert first == ["b5", "a1", "b2"]  # what was owed, then this step's own
    assert second == ["a3"]


def test_an_add_cancelled_while_the_stages_take_it_is_aborted_once_it_is_in() -> None:
    async def run() -> list[Any]:
        tokenizer = SlowTokenizer()
        detokenizer = FakeStage("detokenizer")
        flow = _flow(tokenizer, FakeStage("engine"), detokenizer)
        add = asyncio.get_running_loop().create_task(
            flow.add_request("me", "c", pb.Prompt(text="x"), pb.SamplingParams()))
        await asyncio.sleep(0.01)
        add.cancel()
        with pytest.raises(asyncio.CancelledError):
            await add
        assert detokenizer.sent == []  # not before the stages have it: it would miss
        tokenizer.release.set()
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert await flow.get_num_unfinished_requests("me") == 0
        return detokenizer.sent

    sent = asyncio.run(run())
    assert [list(m.abort.request_ids) for m in sent] == [[internal_id("me", "c")]]


def test_an_aborted_stream_ends_with_a_final_abort_output() -> None:
    async def run() -> pb.RequestOutput | None:
        tokenizer = SlowTokenizer()
        tokenizer.release.set()
        flow = _flow(tokenizer, FakeStage("engine"), FakeStage("detokenizer"))
        queue = StreamOutputs(aggregate=True)
        await flow.add_request("me", "s", pb.Prompt(text="x"), pb.SamplingParams(n=1),
                               queue=queue)
        await flow.abort("me", ["s"])
        return queue.get_nowait()

    last = asyncio.run(run())
    assert last is not None and last.finished
    assert [c.finish_reason for c in last.outputs] == ["abort"]


def test_routes_send_each_output_to_its_gateway_and_the_step_batch_to_the_stepper() -> None:
    async def run() -> tuple[list[dpb.OutputBatch | None], list[dpb.OutputBatch | None]]:
        routes = Routes()
        q1, q2 = routes.subscribe("gw-1"), routes.subscribe("gw-2")
        routes.own("a", "gw-1")
        routes.own("b", "gw-2")
        routes.send([_output("b", 1)], step_id=4, step_origin="gw-1")
        routes.send([_output("a", 2, finished=True), _output("b", 3)])
        orphans = routes.unsubscribe("gw-2", q2)
        assert orphans == ["b"]
        assert routes.owned() == []  # a finished, b's gateway left
        return ([q1.get_nowait() for _ in range(q1.qsize())],
                [q2.get_nowait() for _ in range(q2.qsize())])

    one, two = asyncio.run(run())
    # gw-1 ran step 4: it gets a batch tagged 4 though none of that step's outputs were its own.
    assert [(b.step_id, [o.request_id for o in b.outputs]) for b in one if b] == [
        (4, []), (0, ["a"])]
    assert [(b.step_id, [o.request_id for o in b.outputs]) for b in two if b] == [
        (0, ["b"]), (0, ["b"])]


def test_a_stream_read_late_gets_its_outputs_merged_and_another_stream_is_untouched() -> None:
    async def run() -> tuple[list[pb.RequestOutput], list[pb.RequestOutput]]:
        tokenizer = SlowTokenizer()
        tokenizer.release.set()
        flow = _flow(tokenizer, FakeStage("engine"), FakeStage("detokenizer"))
        slow, prompt = StreamOutputs(aggregate=True), StreamOutputs(aggregate=True)
        await flow.add_request("me", "slow", pb.Prompt(text="x"), pb.SamplingParams(),
                               queue=slow)
        await flow.add_request("you", "quick", pb.Prompt(text="x"), pb.SamplingParams(),
                               queue=prompt)
        s, q = internal_id("me", "slow"), internal_id("you", "quick")
        read: list[pb.RequestOutput] = []
        for token in range(4):  # four steps' batches; only "quick" is read between them
            last = token == 3
            flow._on_batch(dpb.OutputBatch(outputs=[_output(s, token, last),
                                                    _output(q, token, last)]))
            read.append(await prompt.get())
        return [await slow.get()], read

    slow, quick = asyncio.run(run())
    assert len(slow) == 1 and list(slow[0].outputs[0].token_ids) == [0, 1, 2, 3]
    assert slow[0].finished and slow[0].outputs[0].finish_reason == "length"
    assert slow[0].request_id == "slow"  # the client's own id, as each output had
    assert [list(o.outputs[0].token_ids) for o in quick] == [[0], [1], [2], [3]]
