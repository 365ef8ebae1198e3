"""EngineCoreOutputs <-> protobuf: what the engine sends the detokenizer every step."""

from __future__ import annotations

import pytest

from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from strand.engine_core.core.runner_output import LogprobsLists
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert import (
    core_outputs_from_pb,
    core_outputs_to_pb,
    core_request_from_pb,
    core_request_to_pb,
    logprobs_lists_from_pb,
    logprobs_lists_to_pb,
    params_from_pb,
)

# Rows of different widths: a sampled row with top-2, and prompt rows with and without top-k.
LISTS = LogprobsLists(logprob_token_ids=[[5, 9, 2], [7], [3, 4]],
                      logprobs=[[-0.5, -1.25, -3.0], [-0.125], [-2.0, -0.25]],
                      sampled_token_ranks=[1, 4, 2])


def test_logprobs_lists_round_trip_with_rows_of_different_widths() -> None:
    back = logprobs_lists_from_pb(pb.LogprobsLists.FromString(
        logprobs_lists_to_pb(LISTS).SerializeToString()))
    assert back == LISTS


def test_logprobs_travel_as_flat_columns_not_one_message_per_token() -> None:
    msg = logprobs_lists_to_pb(LISTS)
    assert list(msg.token_ids) == [5, 9, 2, 7, 3, 4]
    assert list(msg.row_lengths) == [3, 1, 2]
    assert list(msg.sampled_token_ranks) == [1, 4, 2]


def test_rows_that_do_not_cover_the_columns_are_refused() -> None:
    msg = pb.LogprobsLists(token_ids=[1, 2, 3], logprobs=[-1.0, -2.0, -3.0], row_lengths=[2])
    with pytest.raises(ValueError, match="logprobs rows must cover"):
        logprobs_lists_from_pb(msg)


def test_engine_core_outputs_round_trip() -> None:
    outputs = EngineCoreOutputs(
        outputs=[EngineCoreOutput("a", [11], new_logprobs=LISTS, finish_reason="stop",
                                  stop_reason=2, num_cached_tokens=16,
                                  first_scheduled_time=12.5),
                 EngineCoreOutput("b", [12, 13], new_prompt_logprobs=LISTS, stop_reason="\n",
                                  finish_reason="stop"),
                 EngineCoreOutput("c", [])],
        finished_requests={"a", "b"}, timestamp=99.0, scheduler_stats={"kv_cache_usage": 0.5})
    back = core_outputs_from_pb(pb.EngineCoreOutputs.FromString(
        core_outputs_to_pb(outputs).SerializeToString()))
    assert back == outputs


def _request_with(params: SamplingParams) -> EngineCoreRequest:
    return EngineCoreRequest(request_id="r", prompt_token_ids=[1, 2, 3], sampling_params=params,
                             eos_token_id=2, arrival_time=1.0)


def test_engine_requests_carry_params_as_data_without_validating_them_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    params = SamplingParams(n=1, temperature=0.7, top_p=0.9, top_k=5, seed=3, stop=["x"],
                            max_tokens=9, logit_bias={4: 1.5})
    msg = core_request_to_pb(_request_with(params))

    def refuse(self: SamplingParams) -> None:
        raise AssertionError("validated a second time downstream of the tokenizer")

    monkeypatch.setattr(SamplingParams, "validate", refuse)
    back = core_request_from_pb(pb.EngineCoreRequest.FromString(msg.SerializeToString()))
    assert back.sampling_params == params


def test_the_tokenizer_side_conversion_still_validates() -> None:
    msg = core_request_to_pb(_request_with(SamplingParams(top_p=0.5)))
    msg.sampling_params.top_p = 1.5
    with pytest.raises(ValueError, match="top_p must be in"):
        params_from_pb(msg.sampling_params)
