"""Engine-core messages and RequestOutputs survive pb round trips field for field."""

from __future__ import annotations

from strand.engine_core.core.engine_io import EngineCoreRequest
from strand.engine_core.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from strand.engine_core.processing.input_processor import ProcessedPrompt
from strand.engine_core.sampling_params import SamplingParams
from strand.services.common.convert import (
    core_request_from_pb,
    core_request_to_pb,
    request_output_from_pb,
    request_output_to_pb,
)
from strand.services.common.convert_core import processed_from_pb, processed_to_pb


def _core_request(**changes: object) -> EngineCoreRequest:
    values: dict[str, object] = dict(
        request_id="1_req", prompt_token_ids=[1, 17, 300], eos_token_id=2,
        sampling_params=SamplingParams(temperature=0.5, seed=3, max_tokens=8),
        arrival_time=1700000000.25, priority=-2, cache_salt="salt")
    values.update(changes)
    return EngineCoreRequest(**values)  # type: ignore[arg-type]


def test_engine_core_request_round_trips() -> None:
    req = _core_request()
    assert core_request_from_pb(core_request_to_pb(req)) == req


def test_engine_core_request_without_eos_or_salt_round_trips() -> None:
    req = _core_request(eos_token_id=None, cache_salt=None)
    assert core_request_from_pb(core_request_to_pb(req)) == req


def test_processed_prompt_round_trips_with_and_without_text() -> None:
    for text in ("hello", None):
        processed = ProcessedPrompt(request=_core_request(), prompt=text)
        assert processed_from_pb(processed_to_pb(processed)) == processed


def full_request_output() -> RequestOutput:
    """A RequestOutput with every field set (n=2, logprobs, prompt logprobs, metrics, extra)."""
    return RequestOutput(
        request_id="r", prompt="hi", prompt_token_ids=[1, 2],
        outputs=[
            CompletionOutput(index=0, text="ab", token_ids=[7, 8], cumulative_logprob=-1.25,
                             logprobs=[{7: Logprob(-0.5, 1, "a"), 3: Logprob(-2.0, 2, None)},
                                       {8: Logprob(-0.75, None, "b")}],
                             finish_reason="stop", stop_reason="b"),
            CompletionOutput(index=1, text="", token_ids=[], finish_reason="length",
                             stop_reason=42),
        ],
        finished=True,
        prompt_logprobs=[None, {2: Logprob(-4.0, 9, "x")}],
        num_cached_tokens=16,
        metrics=RequestMetrics(arrival_time=10.0, first_scheduled_time=10.5,
                               first_token_time=11.0, last_token_time=12.0, finished_time=12.0,
                               preemption_times=[11.5]),
        error=None, extra={"note": "kept", "count": 3})


def test_request_output_round_trips_every_field() -> None:
    out = full_request_output()
    assert request_output_from_pb(request_output_to_pb(out)) == out


def test_logprob_dict_keeps_the_engines_order() -> None:
    position = {9: Logprob(-3.0), 1: Logprob(-0.1), 5: Logprob(-1.0)}
    out = RequestOutput("r", None, [1], [CompletionOutput(0, "", [9], logprobs=[position])],
                        finished=False)
    back = request_output_from_pb(request_output_to_pb(out))
    assert back.outputs[0].logprobs is not None
    assert list(back.outputs[0].logprobs[0]) == [9, 1, 5]


def test_error_output_keeps_its_reason() -> None:
    out = RequestOutput("r", None, [1], [CompletionOutput(0, "", [], finish_reason="error")],
                      finished=True, error="engine stage is unavailable")
    back = request_output_from_pb(request_output_to_pb(out))
    assert back.error == "engine stage is unavailable"
    assert back.outputs[0].finish_reason == "error"
