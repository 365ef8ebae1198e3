"""One engine step's outputs <-> its columnar message (types.proto EngineCoreOutputs).

The engine builds the message on its core thread between two steps, so its cost is added to
every step: columns of request ids and tokens instead of a sub-message per request, and the rare
fields (logprobs, a finish, a first scheduled time, preemptions) only for the outputs that have
them (benchmarks/step_message.py has the cost per request either way).
"""

from __future__ import annotations

from google.protobuf.unknown_fields import UnknownFieldSet

from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreOutputs
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert_core import (
    logprobs_lists_from_pb,
    logprobs_lists_to_pb,
    set_stop_reason,
    stop_reason_from_pb,
)


def core_outputs_to_pb(outs: EngineCoreOutputs) -> pb.EngineCoreOutputs:
    outputs = outs.outputs
    msg = pb.EngineCoreOutputs(
        request_ids=[o.request_id for o in outputs],
        num_new_tokens=[len(o.new_token_ids) for o in outputs],
        new_token_ids=[t for o in outputs for t in o.new_token_ids],
        num_cached_tokens=[o.num_cached_tokens for o in outputs],
        extras=[_extras_to_pb(i, o) for i, o in enumerate(outputs) if o.has_extras],
        finished_requests=sorted(outs.finished_requests),
        timestamp=outs.timestamp)
    if outs.scheduler_stats is not None:
        msg.scheduler_stats.values.update(outs.scheduler_stats)
    return msg


def core_outputs_from_pb(msg: pb.EngineCoreOutputs) -> EngineCoreOutputs:
    """ValueError naming the field when the columns disagree, or when the message has fields this
    version does not know: an engine of an older version sent its outputs as field 1, which
    would otherwise read as a step with no outputs, every token lost without a word."""
    if len(UnknownFieldSet(msg)):
        raise ValueError("EngineCoreOutputs has fields this version does not know: the engine "
                         "stage runs another Strand version (run every stage at one version)")
    ids, counts, cached = msg.request_ids, msg.num_new_tokens, msg.num_cached_tokens
    tokens = list(msg.new_token_ids)
    if not len(ids) == len(counts) == len(cached):
        raise ValueError(f"EngineCoreOutputs: {len(ids)} request_ids, {len(counts)} "
                         f"num_new_tokens and {len(cached)} num_cached_tokens (must be equal)")
    if len(tokens) == len(ids) and all(n == 1 for n in counts):  # a decode step
        outputs = [EngineCoreOutput(r, [t], num_cached_tokens=c)
                   for r, t, c in zip(ids, tokens, cached, strict=True)]
    else:
        outputs = _outputs_by_count(ids, counts, tokens, cached)
    for extras in msg.extras:
        if extras.index >= len(outputs):
            raise ValueError(f"EngineCoreOutputs.extras.index {extras.index} is out of range "
                             f"(must be < {len(outputs)}, the number of request_ids)")
        _extras_from_pb(extras, outputs[extras.index])
    return EngineCoreOutputs(
        outputs=outputs,
        finished_requests=set(msg.finished_requests),
        timestamp=msg.timestamp,
        scheduler_stats=(dict(msg.scheduler_stats.values)
                         if msg.HasField("scheduler_stats") else None),
    )


def _outputs_by_count(ids: list[str], counts: list[int], tokens: list[int],
                      cached: list[int]) -> list[EngineCoreOutput]:
    if sum(counts) != len(tokens):
        raise ValueError(f"EngineCoreOutputs: num_new_tokens add up to {sum(counts)}, but "
                         f"new_token_ids has {len(tokens)} (must be equal)")
    outputs = []
    start = 0
    for request_id, count, num_cached in zip(ids, counts, cached, strict=True):
        outputs.append(EngineCoreOutput(request_id, tokens[start:start + count],
                                        num_cached_tokens=num_cached))
        start += count
    return outputs


def _extras_to_pb(index: int, out: EngineCoreOutput) -> pb.EngineCoreOutputExtras:
    msg = pb.EngineCoreOutputExtras(index=index)
    if out.new_logprobs is not None:
        msg.new_logprobs.CopyFrom(logprobs_lists_to_pb(out.new_logprobs))
    if out.new_prompt_logprobs is not None:
        msg.new_prompt_logprobs.CopyFrom(logprobs_lists_to_pb(out.new_prompt_logprobs))
    if out.finish_reason is not None:
        msg.finish_reason = out.finish_reason
    set_stop_reason(msg, out.stop_reason)
    if out.first_scheduled_time is not None:
        msg.first_scheduled_time = out.first_scheduled_time
    if out.preempted_times:
        msg.preempted_times.extend(out.preempted_times)
    if out.held_times:
        msg.held_times.extend(out.held_times)
    if out.pooling_output is not None:
        msg.pooling_output.values.extend(out.pooling_output)
    return msg


def _extras_from_pb(msg: pb.EngineCoreOutputExtras, out: EngineCoreOutput) -> None:
    if msg.HasField("new_logprobs"):
        out.new_logprobs = logprobs_lists_from_pb(msg.new_logprobs)
    if msg.HasField("new_prompt_logprobs"):
        out.new_prompt_logprobs = logprobs_lists_from_pb(msg.new_prompt_logprobs)
    if msg.HasField("finish_reason"):
        out.finish_reason = msg.finish_reason
    out.stop_reason = stop_reason_from_pb(msg)
    if msg.HasField("first_scheduled_time"):
        out.first_scheduled_time = msg.first_scheduled_time
    if msg.preempted_times:
        out.preempted_times = list(msg.preempted_times)
    if msg.held_times:
        out.held_times = list(msg.held_times)
    if msg.HasField("pooling_output"):
        out.pooling_output = list(msg.pooling_output.values)
