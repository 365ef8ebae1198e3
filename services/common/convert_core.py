"""pb <-> dataclass for the stages' messages: EngineCoreRequest, EngineCoreOutput(s), ProcessedPrompt."""

from __future__ import annotations

import itertools

from engine_core.core.engine_io import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from engine_core.core.runner_output import LogprobsLists
from engine_core.processing.input_processor import ProcessedPrompt
from services._proto.strand.v1 import types_pb2 as pb
from services.common.convert_params import params_from_pb, params_to_pb


def core_request_to_pb(req: EngineCoreRequest) -> pb.EngineCoreRequest:
    msg = pb.EngineCoreRequest(
        request_id=req.request_id,
        prompt_token_ids=req.prompt_token_ids,
        sampling_params=params_to_pb(req.sampling_params),
        arrival_time=req.arrival_time,
        priority=req.priority,
    )
    if req.eos_token_id is not None:
        msg.eos_token_id = req.eos_token_id
    if req.cache_salt is not None:
        msg.cache_salt = req.cache_salt
    return msg


def core_request_from_pb(msg: pb.EngineCoreRequest) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=msg.request_id,
        prompt_token_ids=list(msg.prompt_token_ids),
        sampling_params=params_from_pb(msg.sampling_params, validated=True),
        eos_token_id=msg.eos_token_id if msg.HasField("eos_token_id") else None,
        arrival_time=msg.arrival_time,
        priority=msg.priority,
        cache_salt=msg.cache_salt if msg.HasField("cache_salt") else None,
    )


def logprobs_lists_to_pb(lists: LogprobsLists) -> pb.LogprobsLists:
    return pb.LogprobsLists(
        token_ids=list(itertools.chain.from_iterable(lists.logprob_token_ids)),
        logprobs=list(itertools.chain.from_iterable(lists.logprobs)),
        row_lengths=[len(ids) for ids in lists.logprob_token_ids],
        sampled_token_ranks=lists.sampled_token_ranks,
    )


def logprobs_lists_from_pb(msg: pb.LogprobsLists) -> LogprobsLists:
    token_ids, logprobs = list(msg.token_ids), list(msg.logprobs)
    if len(token_ids) != len(logprobs) or sum(msg.row_lengths) != len(token_ids):
        raise ValueError(f"logprobs rows must cover token_ids and logprobs exactly: "
                         f"{len(token_ids)} ids, {len(logprobs)} logprobs, rows "
                         f"{list(msg.row_lengths)}")
    ids_rows: list[list[int]] = []
    lp_rows: list[list[float]] = []
    start = 0
    for length in msg.row_lengths:
        ids_rows.append(token_ids[start:start + length])
        lp_rows.append(logprobs[start:start + length])
        start += length
    return LogprobsLists(logprob_token_ids=ids_rows, logprobs=lp_rows,
                         sampled_token_ranks=list(msg.sampled_token_ranks))


def core_output_to_pb(out: EngineCoreOutput) -> pb.EngineCoreOutput:
    msg = pb.EngineCoreOutput(request_id=out.request_id, new_token_ids=out.new_token_ids,
                              num_cached_tokens=out.num_cached_tokens)
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
    return msg


def core_output_from_pb(msg: pb.EngineCoreOutput) -> EngineCoreOutput:
    return EngineCoreOutput(
        request_id=msg.request_id,
        new_token_ids=list(msg.new_token_ids),
        new_logprobs=(logprobs_lists_from_pb(msg.new_logprobs)
                      if msg.HasField("new_logprobs") else None),
        new_prompt_logprobs=(logprobs_lists_from_pb(msg.new_prompt_logprobs)
                             if msg.HasField("new_prompt_logprobs") else None),
        finish_reason=msg.finish_reason if msg.HasField("finish_reason") else None,
        stop_reason=stop_reason_from_pb(msg),
        num_cached_tokens=msg.num_cached_tokens,
        first_scheduled_time=(msg.first_scheduled_time
                              if msg.HasField("first_scheduled_time") else None),
        preempted_times=list(msg.preempted_times) or None,
    )


def core_outputs_to_pb(outs: EngineCoreOutputs) -> pb.EngineCoreOutputs:
    msg = pb.EngineCoreOutputs(outputs=[core_output_to_pb(o) for o in outs.outputs],
                               finished_requests=sorted(outs.finished_requests),
                               timestamp=outs.timestamp)
    if outs.scheduler_stats is not None:
        msg.scheduler_stats.values.update(outs.scheduler_stats)
    return msg


def core_outputs_from_pb(msg: pb.EngineCoreOutputs) -> EngineCoreOutputs:
    return EngineCoreOutputs(
        outputs=[core_output_from_pb(o) for o in msg.outputs],
        finished_requests=set(msg.finished_requests),
        timestamp=msg.timestamp,
        scheduler_stats=(dict(msg.scheduler_stats.values)
                         if msg.HasField("scheduler_stats") else None),
    )


def set_stop_reason(msg: pb.EngineCoreOutput | pb.CompletionOutput,
                     reason: int | str | None) -> None:
    if isinstance(reason, str):
        msg.stop_str = reason
    elif reason is not None:
        msg.stop_token_id = int(reason)


def stop_reason_from_pb(msg: pb.EngineCoreOutput | pb.CompletionOutput) -> int | str | None:
    kind = msg.WhichOneof("stop_reason")
    if kind == "stop_str":
        return msg.stop_str
    if kind == "stop_token_id":
        return msg.stop_token_id
    return None




def processed_to_pb(processed: ProcessedPrompt) -> pb.ProcessedPrompt:
    msg = pb.ProcessedPrompt(request=core_request_to_pb(processed.request))
    if processed.prompt is not None:
        msg.prompt = processed.prompt
    return msg


def processed_from_pb(msg: pb.ProcessedPrompt) -> ProcessedPrompt:
    return ProcessedPrompt(request=core_request_from_pb(msg.request),
                           prompt=msg.prompt if msg.HasField("prompt") else None)
