"""How the tokenizer adds a request: to an auto-stepping engine the detokenizer's state and the
engine's children go out at once, and a refusal on either side takes the request back from the
other; to a manually stepped engine, the detokenizer first. Either way the children are the
ones the detokenizer makes (parallel_sampling.fan_out)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from strand.engine_core.processing.input_processor import InputProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import tokenizer_pb2 as tpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.status import StageError
from strand.services.tokenizer.engine_modes import EngineModes
from strand.services.tokenizer.servicer import (
    INLINE_MAX_TEXT_CHARS,
    INLINE_MAX_TOKEN_IDS,
    TokenizerServicer,
    processes_inline,
)


class FakeStage:
    """Records each call's kind; refuses adds when told to."""

    def __init__(self, log: list[str], name: str, refuse_add: bool = False) -> None:
        self.log, self.name, self.refuse_add = log, name, refuse_add

    async def call(self, msg: Any) -> Any:
        kind = msg.WhichOneof("kind")
        self.log.append(f"{self.name}.{kind}")
        await asyncio.sleep(0)
        if kind == "add" and self.refuse_add:
            raise StageError(grpc.StatusCode.ALREADY_EXISTS, f"{self.name} refused")
        if kind == "add" and self.name == "engine":
            self.log.append("children=" + ",".join(r.request_id for r in msg.add.requests))
        return SimpleNamespace()

    def send(self, msg: Any) -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(self.call(msg))


class FakeEngines:
    def __init__(self, stage: FakeStage, auto: bool) -> None:
        self.stage = stage
        self.listeners: list[Any] = []

        async def get_info(*args: Any, **kwargs: Any) -> epb.EngineInfo:
            stage.log.append("engine.info")
            return epb.EngineInfo(auto_step=auto)
        self.clients = {"e": SimpleNamespace(stub=SimpleNamespace(GetInfo=get_info))}

    async def call(self, name: str, msg: Any) -> Any:
        return await self.stage.call(msg)

    def send(self, name: str, msg: Any) -> asyncio.Task[Any]:
        return self.stage.send(msg)


class OneReplica:
    def route(self, *args: Any) -> str:
        return "e"

    def answered(self, replica: str) -> None:
        pass


def _add(tiny_model_dir: Path, auto: bool, refuse: str = "", n: int = 1
         ) -> tuple[tpb.TokenizerResponse, list[str]]:
    log: list[str] = []
    detok = FakeStage(log, "detok", refuse_add=refuse in ("detok", "both"))
    engines = FakeEngines(FakeStage(log, "engine", refuse_add=refuse in ("engine", "both")), auto)
    processor = InputProcessor(Tokenizer.from_dir(str(tiny_model_dir)), 64, 512)
    servicer = TokenizerServicer(processor, cast(Any, detok), cast(Any, engines),
                                 cast(Any, OneReplica()))
    process = tpb.ProcessRequest(request_id="r", origin="gw", prompt=pb.Prompt(
        token_ids=pb.TokenIds(ids=[5, 6, 7])), params=pb.SamplingParams(n=n, max_tokens=3))

    async def run() -> tpb.TokenizerResponse:
        first = await servicer.answer(tpb.TokenizerRequest(seq=1, process=process))
        if not first.HasField("error"):  # the mode is asked once
            process.request_id = "r2"
            await servicer.answer(tpb.TokenizerRequest(seq=2, process=process))
        return first
    try:
        return asyncio.run(run()), log
    finally:
        servicer._executor.shutdown(wait=True)


def test_auto_mode_sends_both_at_once_with_the_detokenizers_children(
        tiny_model_dir: Path) -> None:
    answer, log = _add(tiny_model_dir, auto=True, n=2)
    assert list(answer.added.child_ids) == ["0_r", "1_r"]
    # Both writes go out before either answer is awaited, the engine's first (it is on the way
    # to the first token); GetInfo only for the first add.
    assert log[:4] == ["engine.info", "engine.add", "detok.add", "children=0_r,1_r"]
    assert log.count("engine.info") == 1


def test_manual_mode_adds_in_turn(tiny_model_dir: Path) -> None:
    answer, log = _add(tiny_model_dir, auto=False)
    assert list(answer.added.child_ids) == ["r"]
    assert log[:4] == ["engine.info", "detok.add", "engine.add", "children=r"]


@pytest.mark.parametrize("auto", [True, False])
def test_an_engine_refusal_takes_the_state_back_from_the_detokenizer(
        tiny_model_dir: Path, auto: bool) -> None:
    answer, log = _add(tiny_model_dir, auto=auto, refuse="engine")
    assert answer.error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    assert "engine refused" in answer.error.message
    assert log[-1] == "detok.abort"


def test_a_detokenizer_refusal_takes_the_children_back_from_the_engine(
        tiny_model_dir: Path) -> None:
    answer, log = _add(tiny_model_dir, auto=True, refuse="detok")
    assert "detok refused" in answer.error.message
    assert log[-1] == "engine.abort"


def test_both_refusing_leaves_nothing_to_take_back(tiny_model_dir: Path) -> None:
    answer, log = _add(tiny_model_dir, auto=True, refuse="both")
    assert "detok refused" in answer.error.message
    assert not any(entry.endswith(".abort") for entry in log)


def test_the_inline_bounds() -> None:
    def ids(n: int) -> pb.Prompt:
        return pb.Prompt(token_ids=pb.TokenIds(ids=[1] * n))
    assert processes_inline(ids(INLINE_MAX_TOKEN_IDS))
    assert not processes_inline(ids(INLINE_MAX_TOKEN_IDS + 1))
    assert processes_inline(pb.Prompt(text="x" * INLINE_MAX_TEXT_CHARS))
    assert not processes_inline(pb.Prompt(text="x" * (INLINE_MAX_TEXT_CHARS + 1)))
    chat = pb.Prompt(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi")]))
    assert not processes_inline(chat)  # templates may be slow: always the thread


@pytest.mark.parametrize("text_len", [40, INLINE_MAX_TEXT_CHARS + 40])
def test_short_prompts_on_the_loop_long_ones_on_the_thread_same_tokens(
        tiny_model_dir: Path, text_len: int) -> None:
    """Where a prompt is processed changes nothing in the request, and refusals are the same."""
    log: list[str] = []
    engines = FakeEngines(FakeStage(log, "engine"), auto=True)
    processor = InputProcessor(Tokenizer.from_dir(str(tiny_model_dir)), 4096, 512)
    servicer = TokenizerServicer(processor, cast(Any, FakeStage(log, "detok")),
                                 cast(Any, engines), cast(Any, OneReplica()))
    threads: list[str] = []
    process_on = servicer._process

    def recording(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return process_on(*args)
    servicer._process = recording  # type: ignore[method-assign]
    text = ("hello world " * 200)[:text_len]

    def msg(request_id: str, prompt: pb.Prompt) -> tpb.TokenizerRequest:
        return tpb.TokenizerRequest(seq=1, process=tpb.ProcessRequest(
            request_id=request_id, origin="gw", prompt=prompt,
            params=pb.SamplingParams(max_tokens=2)))

    async def run() -> tuple[tpb.TokenizerResponse, tpb.TokenizerResponse]:
        ok = await servicer.answer(msg("a", pb.Prompt(text=text)))
        bad = await servicer.answer(msg("b", pb.Prompt(text=text, cache_salt="")))
        return ok, bad
    try:
        ok, bad = asyncio.run(run())
    finally:
        servicer._executor.shutdown(wait=True)
    expected = processor.process("a", text).request.prompt_token_ids
    assert ok.added.num_prompt_tokens == len(expected)
    inline = text_len <= INLINE_MAX_TEXT_CHARS
    assert all(name == threading.main_thread().name for name in threads) == inline
    assert all(name.startswith("tokenize") for name in threads) == (not inline)
    assert bad.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "cache_salt" in bad.error.message


def _abort_while_held(tiny_model_dir: Path,
                      stages: Callable[[], tuple[Any, Any, asyncio.Event, asyncio.Event]]
                      ) -> tpb.TokenizerResponse:
    """One add of request "r" through the stages `stages()` makes (detokenizer, engines, the
    event set once the add is held, the event that lets it go on); once it is held, an abort of
    "r"; then the add's answer."""
    processor = InputProcessor(Tokenizer.from_dir(str(tiny_model_dir)), 64, 512)

    async def run() -> tpb.TokenizerResponse:
        detok, engines, held, release = stages()
        servicer = TokenizerServicer(processor, cast(Any, detok), cast(Any, engines),
                                     cast(Any, OneReplica()))
        try:
            add = asyncio.ensure_future(
                servicer.answer(tpb.TokenizerRequest(seq=1, process=_process("r"))))
            await held.wait()
            await servicer.answer(tpb.TokenizerRequest(seq=2, abort=tpb.TokenizerAbort(
                request_ids=["r"])))
            release.set()
            return await add
        finally:
            servicer._executor.shutdown(wait=True)
    return asyncio.run(run())


class GatedEngines(FakeEngines):
    """GetInfo waits until released: the first adds after a start ask the mode and wait for it
    (under load, tens of milliseconds), as long as an abort may take to come."""

    def __init__(self, stage: FakeStage, auto: bool) -> None:
        super().__init__(stage, auto)
        self.asked = asyncio.Event()
        self.release = asyncio.Event()
        answer = self.clients["e"].stub.GetInfo

        async def gated(*args: Any, **kwargs: Any) -> epb.EngineInfo:
            self.asked.set()
            await self.release.wait()
            return cast(epb.EngineInfo, await answer(*args, **kwargs))
        self.clients["e"].stub.GetInfo = gated


@pytest.mark.parametrize("auto", [True, False])
def test_an_abort_that_comes_while_the_mode_is_asked_refuses_the_add(
        tiny_model_dir: Path, auto: bool) -> None:
    """The abort finds the request on its way in with nothing sent on yet, so it only marks it;
    the add must then be refused, not sent on to run in the engine until the gateway's own
    abort comes a round trip later (cancelled requests stayed alive a few hundred ms under load)."""
    log: list[str] = []

    def stages() -> tuple[Any, Any, asyncio.Event, asyncio.Event]:
        engines = GatedEngines(FakeStage(log, "engine"), auto)
        return FakeStage(log, "detok"), engines, engines.asked, engines.release

    answer = _abort_while_held(tiny_model_dir, stages)
    assert answer.error.code == grpc.StatusCode.CANCELLED.value[0]
    assert "aborted on its way in" in answer.error.message
    assert log == ["engine.info"]  # nothing sent on, nothing to take back


class GatedDetokenizer(FakeStage):
    """Its add's answer waits until released."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(log, "detok")
        self.adding = asyncio.Event()
        self.release = asyncio.Event()

    async def call(self, msg: Any) -> Any:
        if msg.WhichOneof("kind") == "add":
            self.adding.set()
            await self.release.wait()
        return await super().call(msg)


def test_an_abort_that_comes_while_a_manual_add_waits_for_the_detokenizer_refuses_the_add(
        tiny_model_dir: Path) -> None:
    """Manual mode adds in turn: an abort during the detokenizer's round trip refuses the
    engine's add, and the detokenizer forgets the state it was given."""
    log: list[str] = []

    def stages() -> tuple[Any, Any, asyncio.Event, asyncio.Event]:
        detok = GatedDetokenizer(log)
        return detok, FakeEngines(FakeStage(log, "engine"), False), detok.adding, detok.release

    answer = _abort_while_held(tiny_model_dir, stages)
    assert answer.error.code == grpc.StatusCode.CANCELLED.value[0]
    assert log == ["engine.info", "detok.add", "detok.abort"]


def _process(request_id: str) -> tpb.ProcessRequest:
    return tpb.ProcessRequest(request_id=request_id, origin="gw", prompt=pb.Prompt(
        token_ids=pb.TokenIds(ids=[5, 6, 7])), params=pb.SamplingParams(max_tokens=3))


@pytest.mark.parametrize("which", [0, 9])
def test_an_abort_read_behind_a_burst_of_adds_overtakes_its_add(
        tiny_model_dir: Path, which: int) -> None:
    """A burst of adds and, behind them on the stream, an abort of one: the abort applies as it
    is read, and its add is refused when its turn comes, neither tokenized nor sent on (when
    adds were started as read, every add of the burst ran before the abort, which then found its add
    in the engine and followed it there, aborted only after a step)."""
    log: list[str] = []
    processor = InputProcessor(Tokenizer.from_dir(str(tiny_model_dir)), 64, 512)
    ids = [f"r{i}" for i in range(10)]

    async def run() -> dict[int, tpb.TokenizerResponse]:
        servicer = TokenizerServicer(processor, cast(Any, FakeStage(log, "detok")),
                                     cast(Any, FakeEngines(FakeStage(log, "engine"), True)),
                                     cast(Any, OneReplica()))
        answered = asyncio.Event()

        async def stream() -> AsyncIterator[tpb.TokenizerRequest]:
            for seq, rid in enumerate(ids, 1):
                yield tpb.TokenizerRequest(seq=seq, process=_process(rid))
            yield tpb.TokenizerRequest(seq=99, abort=tpb.TokenizerAbort(
                request_ids=[ids[which]]))
            await answered.wait()

        answers: dict[int, tpb.TokenizerResponse] = {}
        try:
            session = servicer.Session(stream(), cast(Any, None))
            async for answer in session:
                answers[answer.seq] = answer
                if len(answers) == len(ids) + 1:
                    answered.set()
        finally:
            servicer._executor.shutdown(wait=True)
        return answers
    answers = asyncio.run(run())
    refused = answers[which + 1]
    assert refused.error.code == grpc.StatusCode.CANCELLED.value[0]
    assert answers[99].HasField("added")
    assert all(answers[seq].HasField("added") for seq in range(1, 11) if seq != which + 1)
    # Nothing of it reached the engine or the detokenizer, so nothing to abort there.
    assert f"children={ids[which]}" not in log
    assert log.count("engine.add") == log.count("detok.add") == len(ids) - 1
    assert "engine.abort" not in log


def test_the_adds_waiting_for_a_replicas_mode_share_one_getinfo(tiny_model_dir: Path) -> None:
    """A burst of adds after a start asks the mode once, not once per add (under load each
    GetInfo took 30-130 ms and loaded the engine); the answer is remembered."""
    log: list[str] = []
    processor = InputProcessor(Tokenizer.from_dir(str(tiny_model_dir)), 64, 512)

    async def run() -> list[tpb.TokenizerResponse]:
        engines = GatedEngines(FakeStage(log, "engine"), True)
        servicer = TokenizerServicer(processor, cast(Any, FakeStage(log, "detok")),
                                     cast(Any, engines), cast(Any, OneReplica()))
        try:
            adds = [asyncio.ensure_future(servicer.answer(
                tpb.TokenizerRequest(seq=i, process=_process(f"r{i}")))) for i in range(8)]
            await engines.asked.wait()
            for _ in range(5):
                await asyncio.sleep(0)
            engines.release.set()
            answers = list(await asyncio.gather(*adds))
            answers.append(await servicer.answer(
                tpb.TokenizerRequest(seq=9, process=_process("r9"))))
            return answers
        finally:
            servicer._executor.shutdown(wait=True)
    answers = asyncio.run(run())
    assert all(a.HasField("added") for a in answers)
    assert log.count("engine.info") == 1
    assert log.count("engine.add") == 9


def test_a_mode_asked_before_the_replica_left_the_rotation_is_not_remembered(
        tiny_model_dir: Path) -> None:
    """A restart may change the mode: the answer to a GetInfo under way when the replica left
    the rotation serves the adds that waited for it, and the next add asks again."""
    log: list[str] = []

    async def run() -> tuple[bool, bool]:
        engines = GatedEngines(FakeStage(log, "engine"), True)
        modes = EngineModes(cast(Any, engines))
        first = asyncio.ensure_future(modes.auto_step("e"))
        await engines.asked.wait()
        for listener in engines.listeners:
            listener("e", False)
        engines.release.set()
        return await first, await modes.auto_step("e")
    assert asyncio.run(run()) == (True, True)
    assert log.count("engine.info") == 2
