"""The tokenizer hands its router the request's LoRA adapter id (and salt) with the prompt: the
engine keys cached blocks by both, so the router's prefix hashes must too."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from strand.engine_core import LoRARequest
from strand.engine_core.processing.input_processor import InputProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.services._proto.strand.v1 import tokenizer_pb2 as tpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert_lora import lora_request_to_pb
from strand.services.common.status import StageUnavailable
from strand.services.tokenizer.servicer import TokenizerServicer

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13]


class RecordingRouter:
    """Records what it was asked to route, then answers that no replica is up (the test stops
    before any engine is called)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], str | None, int | None]] = []

    def route(self, token_ids: Sequence[int], cache_salt: str | None = None,
              lora_int_id: int | None = None) -> str:
        self.calls.append((list(token_ids), cache_salt, lora_int_id))
        raise StageUnavailable("engine", "no engine replica is in rotation")

    def answered(self, replica: str) -> None:
        raise AssertionError("nothing was routed")


def _route(tiny_model_dir: Path, lora: LoRARequest | None,
           salt: str | None) -> tuple[list[int], str | None, int | None]:
    router = RecordingRouter()
    processor = InputProcessor(Tokenizer.from_dir(str(tiny_model_dir)), 64, 512)
    engines = SimpleNamespace(listeners=[])  # only the mode cache's listener is registered
    servicer = TokenizerServicer(processor, cast(Any, None), cast(Any, engines), cast(Any, router))
    process = tpb.ProcessRequest(request_id="r", prompt=pb.Prompt(
        token_ids=pb.TokenIds(ids=PROMPT), cache_salt=salt))
    if lora is not None:
        process.lora_request.CopyFrom(lora_request_to_pb(lora))
    try:
        answer = asyncio.run(servicer.answer(tpb.TokenizerRequest(seq=1, process=process)))
    finally:
        servicer._executor.shutdown(wait=True)
    assert answer.HasField("error")  # the recording router's "no replica"
    assert len(router.calls) == 1
    return router.calls[0]


def test_router_gets_the_adapter_id_and_salt(tiny_model_dir: Path) -> None:
    lora = LoRARequest("a", 7, "/adapters/a")
    assert _route(tiny_model_dir, lora, "t1") == (PROMPT, "t1", 7)
    assert _route(tiny_model_dir, None, None) == (PROMPT, None, None)
