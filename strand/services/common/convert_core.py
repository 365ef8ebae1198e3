"""pb <-> dataclass for the stages' messages: EngineCoreRequest, ProcessedPrompt, logprobs and stop
reasons (a step's outputs: convert_step.py)."""

from __future__ import annotations

import itertools

from strand.engine_core.core.engine_io import EngineCoreRequest
from strand.engine_core.core.runner_output import LogprobsLists
from strand.engine_core.processing.input_processor import ProcessedPrompt
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert_lora import lora_request_to_pb, optional_lora_from_pb
from strand.services.common.convert_params import params_from_pb, params_to_pb
from strand.services.common.convert_pooling import pooling_params_from_pb, pooling_params_to_pb


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
    if req.lora_request is not None:
        msg.lora_request.CopyFrom(lora_request_to_pb(req.lora_request))
    if req.pooling_params is not None:
        msg.pooling_params.CopyFrom(pooling_params_to_pb(req.pooling_params))
    if req.deadline is not None:
        msg.deadline = req.deadline
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
        lora_request=optional_lora_from_pb(msg),
        pooling_params=(pooling_params_from_pb(msg.pooling_params)
                        if msg.HasField("pooling_params") else None),
        deadline=msg.deadline if msg.HasField("deadline") else None,
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


def set_stop_reason(msg: pb.EngineCoreOutputExtras | pb.CompletionOutput,
                     reason: int | str | None) -> None:
    if isinstance(reason, str):
        msg.stop_str = reason
    elif reason is not None:
        msg.stop_token_id = int(reason)


def stop_reason_from_pb(msg: pb.EngineCoreOutputExtras | pb.CompletionOutput) -> int | str | None:
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
