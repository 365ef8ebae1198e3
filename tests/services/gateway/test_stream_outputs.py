"""A Generate stream's outputs at the gateway: what a lagging client gets, merged on the wire
types with nothing lost, and no conversion at all while it keeps up."""

from __future__ import annotations

import asyncio

from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert import request_output_to_pb
from strand.services.gateway.stream_outputs import StreamOutputs
from tests.services.common.test_convert_outputs import full_request_output


def _delta(index: int, text: str, tokens: list[int], finish: str | None = None
           ) -> pb.RequestOutput:
    completion = pb.CompletionOutput(index=index, text=text, token_ids=tokens)
    if finish is not None:
        completion.finish_reason = finish
    return pb.RequestOutput(request_id="r", outputs=[completion], finished=finish is not None)


def test_an_output_read_in_time_is_passed_on_as_it_came() -> None:
    stream = StreamOutputs(aggregate=True)
    first = _delta(0, "a", [1])
    stream.put(first)
    assert asyncio.run(stream.get()) is first  # the same message: nothing converted


def test_deltas_of_a_lagging_reader_merge_sample_by_sample() -> None:
    stream = StreamOutputs(aggregate=True)
    for output in (_delta(0, "a", [1]), _delta(1, "x", [9]), _delta(0, "b", [2], "stop"),
                   _delta(1, "y", [8], "length")):
        stream.put(output)
    merged = stream.get_nowait()
    assert merged is not None and merged.finished
    assert [(c.index, c.text, list(c.token_ids), c.finish_reason) for c in merged.outputs] == [
        (0, "ab", [1, 2], "stop"), (1, "xy", [9, 8], "length")]


def test_cumulative_outputs_of_a_lagging_reader_keep_the_latest() -> None:
    stream = StreamOutputs(aggregate=False)
    stream.put(_delta(0, "a", [1]))
    stream.put(_delta(0, "ab", [1, 2]))
    merged = stream.get_nowait()
    assert merged is not None and list(merged.outputs[0].token_ids) == [1, 2]


def test_a_merge_keeps_every_field_the_wire_carries() -> None:
    full = request_output_to_pb(full_request_output())
    early = pb.RequestOutput()
    early.CopyFrom(full)  # the same request a step before: no samples, metrics or finish yet
    early.ClearField("outputs")
    early.ClearField("metrics")
    early.finished = False
    stream = StreamOutputs(aggregate=False)
    stream.put(early)
    stream.put(full)
    assert stream.get_nowait() == full


def test_the_later_metrics_win() -> None:
    stream = StreamOutputs(aggregate=True)
    early, late = _delta(0, "a", [1]), _delta(0, "b", [2])
    early.metrics.arrival_time, late.metrics.arrival_time = 1.0, 1.0
    late.metrics.finished_time = 2.0
    stream.put(early)
    stream.put(late)
    merged = stream.get_nowait()
    assert merged is not None and merged.metrics.finished_time == 2.0
