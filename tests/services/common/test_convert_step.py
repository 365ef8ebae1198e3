"""A step's outputs travel engine -> detokenizer as columns (strand/services/common/convert_step.py):
every field comes back, in the engine's order, and a message whose columns disagree is refused
by name."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreOutputs
from strand.engine_core.core.runner_output import LogprobsLists
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert import core_outputs_from_pb, core_outputs_to_pb


def test_engine_core_outputs_round_trip_with_logprobs_and_stop_reasons() -> None:
    lists = LogprobsLists(logprob_token_ids=[[5, 5, 9]], logprobs=[[-0.1, -0.1, -2.5]],
                          sampled_token_ranks=[1])
    prompt_lists = LogprobsLists(logprob_token_ids=[[17, 4], [300, 300]],
                                 logprobs=[[-3.0, -1.0], [-0.5, -0.5]],
                                 sampled_token_ranks=[2, 1])
    outs = EngineCoreOutputs(
        outputs=[
            EngineCoreOutput("a", [5], new_logprobs=lists, new_prompt_logprobs=prompt_lists,
                             num_cached_tokens=16, first_scheduled_time=12.5),
            EngineCoreOutput("b", [2], finish_reason="stop", stop_reason=2,
                             preempted_times=[12.25, 12.75]),
            EngineCoreOutput("c", [], finish_reason="abort", stop_reason="END"),
        ],
        finished_requests={"b", "c"}, timestamp=99.0,
        scheduler_stats={"num_running_reqs": 1.0})
    assert core_outputs_from_pb(core_outputs_to_pb(outs)) == outs


def test_engine_core_outputs_without_stats_keep_none() -> None:
    outs = EngineCoreOutputs(outputs=[], timestamp=1.0)
    assert core_outputs_from_pb(core_outputs_to_pb(outs)).scheduler_stats is None


def test_a_decode_step_is_columns_with_extras_only_where_an_output_has_any() -> None:
    outputs = [EngineCoreOutput(f"r{i}", [100 + i], num_cached_tokens=i % 3) for i in range(8)]
    outputs[2].first_scheduled_time = 5.5
    outputs[5].finish_reason, outputs[5].stop_reason = "stop", 7
    outs = EngineCoreOutputs(outputs=outputs, finished_requests={"r5"}, timestamp=3.0)
    msg = core_outputs_to_pb(outs)
    assert list(msg.request_ids) == [f"r{i}" for i in range(8)]
    assert list(msg.new_token_ids) == list(range(100, 108))
    assert [e.index for e in msg.extras] == [2, 5]
    assert core_outputs_from_pb(msg) == outs


def test_outputs_with_no_or_several_tokens_keep_their_tokens_and_order() -> None:
    outs = EngineCoreOutputs(outputs=[
        EngineCoreOutput("a", [1, 2, 3]), EngineCoreOutput("b", []),
        EngineCoreOutput("c", [4], finish_reason="length"), EngineCoreOutput("d", [5, 6])],
        timestamp=1.0)
    assert core_outputs_from_pb(core_outputs_to_pb(outs)) == outs


def test_as_many_tokens_as_requests_but_not_one_each_still_converts() -> None:
    outs = EngineCoreOutputs(outputs=[EngineCoreOutput("a", [1, 2]), EngineCoreOutput("b", [])],
                             timestamp=1.0)
    assert core_outputs_from_pb(core_outputs_to_pb(outs)) == outs


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.num_cached_tokens.append(0), "num_cached_tokens"),
    (lambda m: m.request_ids.append("x"), "request_ids"),
    (lambda m: m.new_token_ids.append(9), "new_token_ids has 4"),
    (lambda m: m.extras.add(index=2), "extras.index 2 is out of range (must be < 2"),
])
def test_a_message_whose_columns_disagree_is_refused_by_field(
        change: Callable[[pb.EngineCoreOutputs], object], message: str) -> None:
    msg = core_outputs_to_pb(EngineCoreOutputs(
        outputs=[EngineCoreOutput("a", [1]), EngineCoreOutput("b", [2, 3])], timestamp=1.0))
    change(msg)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        core_outputs_from_pb(msg)


def test_a_step_from_an_engine_of_the_older_version_is_refused_not_read_as_empty() -> None:
    # Field 1 was `repeated EngineCoreOutput outputs`: one output {request_id: "a"}.
    old = pb.EngineCoreOutputs.FromString(bytes([0x0A, 0x03, 0x0A, 0x01, 0x61]))
    with pytest.raises(ValueError, match="another Strand version"):
        core_outputs_from_pb(old)
