"""GatewayFlow's auto mode against scripted stages: steps are pipelined, adds join together."""

from __future__ import annotations

import asyncio
from typing import Any

from services._proto.strand.v1 import detokenizer_pb2 as dpb
from services._proto.strand.v1 import engine_pb2 as epb
from services._proto.strand.v1 import tokenizer_pb2 as tpb
from services._proto.strand.v1 import types_pb2 as pb
from services.gateway.flow import GatewayFlow

STEP_SECONDS = 0.02
TOKENS_PER_REQUEST = 3


class FakeStage:
    """One message at a time, in the order sent, as on the real stream."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.on_lost: Any = None
        self.log: list[str] = []
        self._order = asyncio.Lock()

    async def call(self, msg: Any) -> Any:
        kind = msg.WhichOneof("kind")
        self.log.append(kind)
        async with self._order:
            return await self.answer(kind, msg)

    async def answer(self, kind: str, msg: Any) -> Any:
        raise NotImplementedError

    async def close(self) -> None:
        pass


class FakeTokenizer(FakeStage):
    async def answer(self, kind: str, msg: Any) -> Any:
        request = pb.EngineCoreRequest(request_id=msg.process.request_id, prompt_token_ids=[1],
                                       sampling_params=msg.process.params)
        return tpb.TokenizerResponse(processed=pb.ProcessedPrompt(request=request))


class FakeEngine(FakeStage):
    def __init__(self, add_seconds: float = 0.0) -> None:
        super().__init__("engine")
        self.running: list[str] = []
        self.add_seconds = add_seconds
        self.num_steps: list[int] = []  # what each step message asked for

    async def answer(self, kind: str, msg: Any) -> Any:
        if kind == "step":
            self.num_steps.append(msg.step.num_steps)
            await asyncio.sleep(STEP_SECONDS)
            self.log.append("step-done")
            outputs = [pb.EngineCoreOutput(request_id=r, new_token_ids=[7]) for r in self.running]
            return epb.EngineResponse(outputs=pb.EngineCoreOutputs(outputs=outputs))
        if kind == "add":
            await asyncio.sleep(self.add_seconds)
            self.running += [r.request_id for r in msg.add.requests]
        if kind == "abort":
            self.running = [r for r in self.running if r not in msg.abort.request_ids]
        return epb.EngineResponse(state=epb.EngineState())


class FakeDetokenizer(FakeStage):
    """Ends a request (finished output) once it has TOKENS_PER_REQUEST tokens."""

    def __init__(self, engine: FakeEngine) -> None:
        super().__init__("detokenizer")
        self.engine = engine
        self.num_tokens: dict[str, int] = {}

    async def answer(self, kind: str, msg: Any) -> Any:
        if kind == "add":
            request = msg.add.processed.request
            self.num_tokens[request.request_id] = 0
            return dpb.DetokenizerResponse(children=dpb.ChildRequests(requests=[request]))
        if kind == "abort":
            known = [r for r in msg.abort.request_ids if self.num_tokens.pop(r, None) is not None]
            return dpb.DetokenizerResponse(child_ids=dpb.RequestIds(request_ids=known))
        finished = []
        for out in msg.process_outputs.outputs.outputs:
            if out.request_id in self.num_tokens:
                self.num_tokens[out.request_id] += len(out.new_token_ids)
                if self.num_tokens[out.request_id] == TOKENS_PER_REQUEST:
                    del self.num_tokens[out.request_id]
                    self.engine.running.remove(out.request_id)
                    finished.append(pb.RequestOutput(request_id=out.request_id, finished=True))
        return dpb.DetokenizerResponse(result=dpb.ProcessOutputsResult(request_outputs=finished))


async def _run_auto(scenario: Any, engine: FakeEngine | None = None) -> list[str]:
    engine = engine or FakeEngine()
    flow = GatewayFlow(FakeTokenizer("tokenizer"), engine, FakeDetokenizer(engine),  # type: ignore[arg-type]
                       auto_step=True)
    flow.start()
    try:
        await asyncio.wait_for(scenario(flow), timeout=10)
        while await flow.get_num_unfinished_requests():
            await asyncio.sleep(0.005)
    finally:
        await flow.close()
    return engine.log


async def _add(flow: GatewayFlow, request_id: str, final_only: bool = False) -> None:
    params = pb.SamplingParams()
    if final_only:
        params.output_kind = pb.FINAL_ONLY
    await flow.add_request(request_id, pb.Prompt(text="x"), params)


def test_auto_mode_sends_the_next_step_before_the_previous_one_is_answered() -> None:
    async def scenario(flow: GatewayFlow) -> None:
        await _add(flow, "a")

    log = asyncio.run(_run_auto(scenario))
    assert log[:4] == ["add", "step", "step", "step-done"]
    assert max(_steps_in_flight(log)) == 2


def test_requests_added_while_a_step_runs_join_the_next_step_together() -> None:
    async def scenario(flow: GatewayFlow) -> None:
        await _add(flow, "a")
        await asyncio.sleep(STEP_SECONDS / 4)  # both of a's steps are queued by now
        await asyncio.gather(_add(flow, "b"), _add(flow, "c"))

    log = asyncio.run(_run_auto(scenario))
    # b and c wait for the two steps already sent, and no step is sent between them.
    assert log[:9] == ["add", "step", "step", "add", "step-done", "step-done", "add",
                       "step", "step"]


def _steps_in_flight(log: list[str]) -> list[int]:
    counts, n = [], 0
    for entry in log:
        n += {"step": 1, "step-done": -1}.get(entry, 0)
        counts.append(n)
    return counts


def test_an_add_cancelled_while_the_engine_takes_it_is_aborted_in_both_stages() -> None:
    # A caller's deadline ends its AddRequest mid-way: the request must not run on unseen.
    async def run() -> tuple[FakeEngine, FakeDetokenizer, int]:
        engine = FakeEngine(add_seconds=0.2)
        detokenizer = FakeDetokenizer(engine)
        flow = GatewayFlow(FakeTokenizer("tokenizer"), engine, detokenizer)  # type: ignore[arg-type]
        add = asyncio.create_task(_add(flow, "a"))
        while "add" not in engine.log:  # the engine has been sent the request
            await asyncio.sleep(0.005)
        add.cancel()
        try:
            await add
        except asyncio.CancelledError:
            pass
        for _ in range(100):  # the abort runs in the background, after the add lands
            if "abort" in engine.log:
                break
            await asyncio.sleep(0.01)
        live = await flow.get_num_unfinished_requests()
        await flow.close()
        return engine, detokenizer, live

    engine, detokenizer, live = asyncio.run(run())
    assert engine.log == ["add", "abort"] and engine.running == []
    assert detokenizer.log == ["add", "abort"] and detokenizer.num_tokens == {}
    assert live == 0


def test_auto_mode_asks_for_several_steps_a_call_only_while_nobody_streams() -> None:
    from services.gateway.flow import STEPS_PER_CALL_UNSTREAMED

    def run(kinds: list[bool]) -> list[int]:
        engine = FakeEngine()

        async def scenario(flow: GatewayFlow) -> None:
            await asyncio.gather(*(_add(flow, f"r{i}", final_only=final_only)
                                   for i, final_only in enumerate(kinds)))

        asyncio.run(_run_auto(scenario, engine))
        return engine.num_steps

    assert set(run([True, True])) == {STEPS_PER_CALL_UNSTREAMED}
    assert set(run([True, False])) == {1}  # one streaming request: every token as it comes
