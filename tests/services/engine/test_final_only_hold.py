"""The engine stage holds FINAL_ONLY tokens until the request ends (strand/services/engine/
final_only_hold.py): what it holds and releases, and that the detokenizer makes the same outputs
and per-token metrics of the released tokens as of the same tokens step by step."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from strand.engine_core.config import EngineArgs
from strand.engine_core.core.engine import EngineCore
from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from strand.engine_core.metrics.request_metrics import RequestStatsRecorder
from strand.engine_core.outputs import RequestOutput
from strand.engine_core.processing.input_processor import ProcessedPrompt
from strand.engine_core.processing.output_processor import OutputProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.common.convert import (
    core_outputs_from_pb,
    core_outputs_to_pb,
    core_request_to_pb,
)
from strand.services.engine.core_calls import CoreCalls
from strand.services.engine.final_only_hold import FinalOnlyHold, holdable
from strand.testing.tiny_tokenizer import write_tiny_tokenizer

FINAL = RequestOutputKind.FINAL_ONLY


def _request(request_id: str, **params: Any) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1, 2, 3], SamplingParams(**params), eos_token_id=0)


def _step(timestamp: float, *outputs: EngineCoreOutput) -> EngineCoreOutputs:
    return EngineCoreOutputs(outputs=list(outputs), timestamp=timestamp)


@pytest.mark.parametrize(("params", "expected"), [
    ({"output_kind": FINAL}, True),
    ({"output_kind": FINAL, "n": 2, "stop_token_ids": [7], "max_tokens": 9}, True),
    ({"output_kind": RequestOutputKind.DELTA}, False),
    ({"output_kind": RequestOutputKind.CUMULATIVE}, False),
    ({"output_kind": FINAL, "stop": ["x"]}, False),  # the detokenizer ends it on its text
    ({"output_kind": FINAL, "logprobs": 1}, False),
    ({"output_kind": FINAL, "prompt_logprobs": 0}, False),
])
def test_which_requests_are_held(params: dict[str, Any], expected: bool) -> None:
    assert holdable(SamplingParams(**params)) is expected


def test_tokens_after_the_first_wait_for_the_finish() -> None:
    hold = FinalOnlyHold()
    hold.added([_request("f", output_kind=FINAL), _request("d", output_kind=RequestOutputKind.DELTA)])
    first = hold.apply(_step(1.0, EngineCoreOutput("f", [5], first_scheduled_time=0.5),
                             EngineCoreOutput("d", [50], first_scheduled_time=0.5)))
    assert [o.request_id for o in first.outputs] == ["f", "d"]  # the first token goes at once
    for t, token in ((2.0, 6), (3.0, 7), (4.0, 8)):
        step = hold.apply(_step(t, EngineCoreOutput("f", [token]), EngineCoreOutput("d", [token])))
        assert [o.request_id for o in step.outputs] == ["d"]
    assert hold.num_held_tokens("f") == 3
    last = hold.apply(_step(5.0, EngineCoreOutput("f", [9], finish_reason="length")))
    (out,) = last.outputs
    assert out.new_token_ids == [6, 7, 8, 9] and out.held_times == [2.0, 3.0, 4.0]
    assert out.finish_reason == "length"
    assert len(hold) == 0  # "d" was never held, "f" is gone
    untouched = _step(6.0, EngineCoreOutput("d", [1]))
    assert hold.apply(untouched) is untouched


def test_a_bound_on_held_tokens_and_events_release_them() -> None:
    hold = FinalOnlyHold(max_tokens=2)
    hold.added([_request("f", output_kind=FINAL)])
    hold.apply(_step(1.0, EngineCoreOutput("f", [1], first_scheduled_time=0.5)))
    assert not hold.apply(_step(2.0, EngineCoreOutput("f", [2]))).outputs
    assert not hold.apply(_step(3.0, EngineCoreOutput("f", [3]))).outputs
    (full,) = hold.apply(_step(4.0, EngineCoreOutput("f", [4]))).outputs  # a third: out
    assert full.new_token_ids == [2, 3, 4] and full.held_times == [2.0, 3.0]
    assert not hold.apply(_step(5.0, EngineCoreOutput("f", [5]))).outputs
    # A preemption is news for the request's metrics: it goes with what was held.
    (preempted,) = hold.apply(_step(6.0, EngineCoreOutput("f", [6], preempted_times=[5.5]))).outputs
    assert preempted.new_token_ids == [5, 6] and preempted.preempted_times == [5.5]
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        FinalOnlyHold(max_tokens=0)


def test_aborted_and_vanished_requests_leave_nothing_held() -> None:
    hold = FinalOnlyHold()
    hold.added([_request(r, output_kind=FINAL) for r in ("a", "b", "c")])
    for rid in ("a", "b", "c"):
        hold.apply(_step(1.0, EngineCoreOutput(rid, [1], first_scheduled_time=0.5)))
        hold.apply(_step(2.0, EngineCoreOutput(rid, [2])))
    hold.forget(["a"])
    assert len(hold) == 2
    hold.prune({"c"})  # "b" left the core some other way
    assert len(hold) == 1 and hold.num_held_tokens("c") == 1
    # An id reused by a streaming request is not held.
    hold.added([_request("c", output_kind=RequestOutputKind.DELTA)])
    assert len(hold) == 0


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("tiny-tokenizer")
    write_tiny_tokenizer(path, 400, seed=0)
    return Tokenizer.from_dir(str(path))


def _run(tokenizer: Tokenizer, steps: list[EngineCoreOutputs], requests: list[EngineCoreRequest],
         hold: FinalOnlyHold | None) -> tuple[dict[str, list[RequestOutput]], dict[str, float]]:
    """Every step through the wire format (and the hold, if any) into an OutputProcessor with
    metrics; its outputs per request and its per-token metric samples."""
    registry = CollectorRegistry()
    processor = OutputProcessor(tokenizer, stats=RequestStatsRecorder(registry, "m", 4096))
    children: list[EngineCoreRequest] = []
    for request in requests:
        children += processor.add_request(ProcessedPrompt(request=request, prompt=None))
    if hold is not None:
        hold.added(children)
    got: dict[str, list[RequestOutput]] = {}
    for step in steps:
        sent = hold.apply(step) if hold is not None else step
        received = core_outputs_from_pb(core_outputs_to_pb(sent))
        for out in processor.process_outputs(received.outputs, received.timestamp).request_outputs:
            got.setdefault(out.request_id, []).append(out)
    samples = {s.name: s.value for m in registry.collect() for s in m.samples
               if s.name.endswith(("_count", "_sum"))}
    return got, samples


def test_the_detokenizer_makes_the_same_outputs_and_metrics_of_held_tokens(
        tokenizer: Tokenizer) -> None:
    rng = random.Random(3)
    eos = tokenizer.eos_token_id
    assert eos is not None
    for case in range(20):
        lengths = {"f": rng.randrange(1, 40), "0_g": rng.randrange(1, 40),
                   "1_g": rng.randrange(1, 40), "d": rng.randrange(1, 40)}
        requests = [
            EngineCoreRequest("f", [5, 6, 7], SamplingParams(output_kind=FINAL), eos, 0.0),
            EngineCoreRequest("g", [5, 6, 7], SamplingParams(output_kind=FINAL, n=2), eos, 0.0),
            EngineCoreRequest("d", [5, 6], SamplingParams(output_kind=RequestOutputKind.DELTA),
                              eos, 0.0),
        ]
        steps = []
        for i in range(max(lengths.values())):
            outs = []
            for rid, length in lengths.items():
                if i >= length:
                    continue
                last = i == length - 1
                stop = last and rid == "f" and case % 2 == 0  # ends on eos: kept out of text
                # A rank failed: the core ends it with no token of this step.
                failed = last and i > 0 and rid == "f" and case % 4 == 1
                outs.append(EngineCoreOutput(
                    rid, [] if failed else [eos if stop else rng.randrange(3, 400)],
                    first_scheduled_time=0.5 if i == 0 else None,
                    preempted_times=[1.0 + i] if rid == "0_g" and i == 7 else None,
                    finish_reason=("stop" if stop else "error" if failed else "length")
                    if last else None,
                    stop_reason=eos if stop else None))
            steps.append(EngineCoreOutputs(outputs=outs, timestamp=1.0 + i + rng.random() / 2))
        by_step, by_step_metrics = _run(tokenizer, steps, requests, None)
        held, held_metrics = _run(tokenizer, steps, requests, FinalOnlyHold(max_tokens=9))
        assert held == by_step, case
        assert held_metrics == pytest.approx(by_step_metrics), case
        assert by_step_metrics["strand:inter_token_latency_seconds_count"] > 0


def test_the_engine_stage_sends_a_final_only_request_twice(tiny_model_dir: Path) -> None:
    """A real core: the FINAL_ONLY request's tokens go out with its first step and its last, the
    streaming one's every step; the tokens are the core's."""
    import torch

    torch.set_num_threads(1)

    def run(hold: bool) -> list[list[EngineCoreOutput]]:
        core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                      kv_cache_memory=8 * 1024**2))
        calls = CoreCalls(core, None, "tiny")
        if not hold:
            calls.hold = None
        reqs = [EngineCoreRequest(rid, [3, 4, 5, 6], SamplingParams(
                    temperature=0.0, max_tokens=6, ignore_eos=True, output_kind=kind), None)
                for rid, kind in (("f", FINAL), ("d", RequestOutputKind.DELTA))]
        calls.handle(epb.EngineRequest(seq=1, add=epb.EngineAddRequests(
            requests=[core_request_to_pb(r) for r in reqs])), _Span())
        steps = []
        while core.has_unfinished_requests():
            steps.append(calls.step(_Span()).outputs)
        assert calls.hold is None or len(calls.hold) == 0
        return steps

    plain, held = run(False), run(True)
    assert [[o.request_id for o in s] for s in held] == [["f", "d"]] + [["d"]] * 4 + [["f", "d"]]

    def tokens(steps: list[list[EngineCoreOutput]], rid: str) -> list[int]:
        return [t for s in steps for o in s if o.request_id == rid for t in o.new_token_ids]

    assert tokens(held, "f") == tokens(plain, "f") and len(tokens(held, "f")) == 6
    assert tokens(held, "d") == tokens(plain, "d")


def test_an_abort_in_the_engine_stage_drops_what_it_held(tiny_model_dir: Path) -> None:
    import torch

    torch.set_num_threads(1)
    core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                  kv_cache_memory=8 * 1024**2))
    calls = CoreCalls(core, None, "tiny")
    assert calls.hold is not None
    reqs = [EngineCoreRequest(rid, [3, 4, 5], SamplingParams(
        temperature=0.0, max_tokens=20, output_kind=FINAL), None) for rid in ("a", "b")]
    calls.handle(epb.EngineRequest(seq=1, add=epb.EngineAddRequests(
        requests=[core_request_to_pb(r) for r in reqs])), _Span())
    for _ in range(4):
        calls.step(_Span())
    assert calls.hold.num_held_tokens("a") == 3 and len(calls.hold) == 2
    calls.handle(epb.EngineRequest(seq=2, abort=epb.EngineAbort(request_ids=["a"])), _Span())
    assert len(calls.hold) == 1
    calls.abort_all()  # the detokenizer went away
    assert len(calls.hold) == 0


def test_tokens_held_across_a_preemption_reach_the_detokenizer_whole(tiny_model_dir: Path,
                                                                     tokenizer: Tokenizer) -> None:
    """A real core short of KV blocks preempts a decoding request while its tokens are held:
    the output that reports the preemption carries them, and the detokenizer ends with the
    text, tokens and metrics of the step-by-step path."""
    import torch

    torch.set_num_threads(1)
    requests = [EngineCoreRequest(f"p{i}", [1 + i, *range(100 + 30 * i, 119 + 30 * i)],
                                  SamplingParams(temperature=0.0, max_tokens=50,
                                                 ignore_eos=True, output_kind=FINAL), None, 0.0)
                for i in range(2)]

    def run(hold: bool) -> tuple[list[EngineCoreOutputs], int]:
        core = EngineCore.from_engine_args(EngineArgs(
            model=str(tiny_model_dir), block_size=16, num_gpu_blocks_override=9,
            max_num_batched_tokens=64))
        calls = CoreCalls(core, None, "tiny")
        if not hold:
            calls.hold = None
        calls.handle(epb.EngineRequest(seq=1, add=epb.EngineAddRequests(
            requests=[core_request_to_pb(r) for r in requests])), _Span())
        steps = []
        while core.has_unfinished_requests():
            steps.append(calls.step(_Span()))
        return steps, core.scheduler.make_stats().num_preemptions

    plain, preemptions = run(False)
    held, _ = run(True)
    assert preemptions > 0
    assert any(o.preempted_times and o.held_times for s in held for o in s.outputs)

    def seen(steps: list[EngineCoreOutputs]) -> tuple[list[Any], dict[str, float]]:
        # The steps went through the engine stage's hold (or not): now the detokenizer's side.
        # The two runs ran at different times: texts, tokens and counts compare, times do not.
        outputs, samples = _run(tokenizer, steps, requests, None)
        return ([(rid, [(c.text, c.token_ids, c.finish_reason) for o in outs for c in o.outputs])
                 for rid, outs in sorted(outputs.items())],
                {k: v for k, v in samples.items() if k.endswith("_count")})

    assert seen(held) == seen(plain)
    assert len(seen(held)[0][0][1][0][1]) == 50


class _Span:
    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def add_event(self, name: str, attributes: Any) -> None:
        pass
