"""Engine outputs that reach the detokenizer before their request's state: kept, in step order,
bounded in count and age, and processed the moment the request arrives; outputs of requests that
ended here are late ones and are not kept."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from strand.engine_core.processing.input_processor import ProcessedPrompt
from strand.engine_core.processing.output_processor import OutputProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.common.convert import core_outputs_to_pb
from strand.services.detokenizer.early_outputs import EarlyOutputs
from strand.services.detokenizer.engine_feed import EngineFeed
from strand.services.detokenizer.routes import Routes


def _out(request_id: str, token: int, finish: str | None = None) -> EngineCoreOutput:
    return EngineCoreOutput(request_id=request_id, new_token_ids=[token], finish_reason=finish)


def test_kept_outputs_come_back_per_step_in_order_and_only_for_the_asked_ids() -> None:
    early = EarlyOutputs()
    early.keep([_out("a", 1), _out("b", 7)], timestamp=10.0, now=0.0)
    early.keep([_out("a", 2)], timestamp=11.0, now=0.1)
    steps = early.take(["a"], now=0.2)
    assert [(t, [o.new_token_ids[0] for o in outs]) for t, outs in steps] == [(10.0, [1]),
                                                                               (11.0, [2])]
    assert len(early) == 1 and early.take(["a"], now=0.3) == []
    assert [o.request_id for _, outs in early.take(["b", "zz"], now=0.3) for o in outs] == ["b"]


def test_outputs_expire_and_the_oldest_go_past_the_bound() -> None:
    early = EarlyOutputs(ttl_s=5.0, max_outputs=3)
    early.keep([_out("a", 1)], timestamp=1.0, now=0.0)
    early.keep([_out("b", 1), _out("c", 1), _out("d", 1)], timestamp=2.0, now=1.0)
    assert len(early) == 3 and early.dropped == 1  # "a" pushed out
    assert early.take(["a"], now=1.0) == []
    assert early.take(["b"], now=6.5) == [] and early.dropped == 4  # the rest expired
    with pytest.raises(ValueError, match="max_outputs must be >= 1"):
        EarlyOutputs(max_outputs=0)
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        EarlyOutputs(ttl_s=0)


def _processed(request_id: str, n: int = 1) -> ProcessedPrompt:
    params = SamplingParams(n=n, max_tokens=4, detokenize=False)
    return ProcessedPrompt(request=EngineCoreRequest(
        request_id=request_id, prompt_token_ids=[5, 6, 7], sampling_params=params,
        eos_token_id=None), prompt=None)


def test_an_output_before_its_request_is_delivered_when_the_request_arrives(
        tiny_model_dir: Path) -> None:
    async def run() -> None:
        processor = OutputProcessor(Tokenizer.from_dir(str(tiny_model_dir)))
        routes = Routes()
        queue = routes.subscribe("gw")
        feed = EngineFeed(processor, routes, "127.0.0.1:1")  # never called: no engine needed
        try:
            # A late output of an ended request is dropped, not kept.
            processor.add_request(_processed("old"))
            processor.abort_requests(["old"])
            step = EngineCoreOutputs(outputs=[_out("1_r", 3), _out("old", 9)], timestamp=5.0)
            await feed._on_step(epb.EngineStepOutputs(outputs=core_outputs_to_pb(step)))
            assert len(feed.early) == 1 and queue.empty()
            children = processor.add_request(_processed("r", n=2))
            routes.own("r", "gw", feed.name)
            feed.arrived(c.request_id for c in children)
            batch = queue.get_nowait()
            assert batch is not None
            assert [o.request_id for o in batch.outputs] == ["r"]
            assert [(c.index, list(c.token_ids)) for c in batch.outputs[0].outputs] == [(1, [3])]
            assert len(feed.early) == 0
        finally:
            await feed.close()
    asyncio.run(run())
