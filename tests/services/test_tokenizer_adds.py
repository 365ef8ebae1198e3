"""How the tokenizer adds a request: to an auto-stepping engine the detokenizer's state and the
engine's children go out at once, and a refusal on either side takes the request back from the
other; to a manually stepped engine, the detokenizer first. Either way the children are the
ones the detokenizer makes (parallel_sampling.fan_out)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from engine_core.processing.input_processor import InputProcessor
from engine_core.processing.tokenizer import Tokenizer
from services._proto.strand.v1 import engine_pb2 as epb
from services._proto.strand.v1 import tokenizer_pb2 as tpb
from services._proto.strand.v1 import types_pb2 as pb
from services.common.status import StageError
from services.tokenizer.servicer import TokenizerServicer


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
    # Both writes go out before either answer is awaited; GetInfo only for the first add.
    assert log[:4] == ["engine.info", "detok.add", "engine.add", "children=0_r,1_r"]
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
