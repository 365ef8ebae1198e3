"""pb <-> dataclass for what a client gets back: RequestOutput and everything inside it, and an
embedding request's PoolingRequestOutput (a RequestOutput message with its `embedding` set)."""

from __future__ import annotations

import json

from strand.engine_core.outputs import (
    CompletionOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
    SampleLogprobs,
)
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert_core import set_stop_reason, stop_reason_from_pb
from strand.services.common.convert_lora import lora_request_to_pb, optional_lora_from_pb

_METRIC_TIMES = ("first_scheduled_time", "first_token_time", "last_token_time", "finished_time")


def _position_to_pb(position: dict[int, Logprob] | None) -> pb.LogprobPosition:
    if position is None:
        return pb.LogprobPosition(absent=True)
    entries = []
    for token_id, lp in position.items():
        item = pb.Logprob(logprob=lp.logprob)
        if lp.rank is not None:
            item.rank = lp.rank
        if lp.decoded_token is not None:
            item.decoded_token = lp.decoded_token
        entries.append(pb.LogprobEntry(token_id=token_id, logprob=item))
    return pb.LogprobPosition(entries=entries)


def _position_from_pb(msg: pb.LogprobPosition) -> dict[int, Logprob] | None:
    if msg.absent:
        return None
    return {
        e.token_id: Logprob(
            logprob=e.logprob.logprob,
            rank=e.logprob.rank if e.logprob.HasField("rank") else None,
            decoded_token=(e.logprob.decoded_token
                           if e.logprob.HasField("decoded_token") else None),
        )
        for e in msg.entries
    }


def _positions_to_pb(positions: SampleLogprobs | PromptLogprobs) -> pb.PositionLogprobs:
    return pb.PositionLogprobs(positions=[_position_to_pb(p) for p in positions])


def metrics_to_pb(metrics: RequestMetrics) -> pb.RequestMetrics:
    msg = pb.RequestMetrics(arrival_time=metrics.arrival_time)
    for name in _METRIC_TIMES:
        value = getattr(metrics, name)
        if value is not None:
            setattr(msg, name, value)
    msg.preemption_times.extend(metrics.preemption_times)
    return msg


def metrics_from_pb(msg: pb.RequestMetrics) -> RequestMetrics:
    times = {n: getattr(msg, n) for n in _METRIC_TIMES if msg.HasField(n)}
    return RequestMetrics(arrival_time=msg.arrival_time, preemption_times=list(msg.preemption_times),
                          **times)


def completion_to_pb(out: CompletionOutput) -> pb.CompletionOutput:
    msg = pb.CompletionOutput(index=out.index, text=out.text, token_ids=out.token_ids)
    if out.cumulative_logprob is not None:
        msg.cumulative_logprob = out.cumulative_logprob
    if out.logprobs is not None:
        msg.logprobs.CopyFrom(_positions_to_pb(out.logprobs))
    if out.finish_reason is not None:
        msg.finish_reason = out.finish_reason
    set_stop_reason(msg, out.stop_reason)
    return msg


def completion_from_pb(msg: pb.CompletionOutput) -> CompletionOutput:
    logprobs: SampleLogprobs | None = None
    if msg.HasField("logprobs"):
        logprobs = [_position_from_pb(p) or {} for p in msg.logprobs.positions]
    return CompletionOutput(
        index=msg.index,
        text=msg.text,
        token_ids=list(msg.token_ids),
        cumulative_logprob=(msg.cumulative_logprob
                            if msg.HasField("cumulative_logprob") else None),
        logprobs=logprobs,
        finish_reason=msg.finish_reason if msg.HasField("finish_reason") else None,
        stop_reason=stop_reason_from_pb(msg),
    )


def request_output_to_pb(out: RequestOutput) -> pb.RequestOutput:
    msg = pb.RequestOutput(
        request_id=out.request_id,
        prompt_token_ids=out.prompt_token_ids,
        outputs=[completion_to_pb(c) for c in out.outputs],
        finished=out.finished,
        num_cached_tokens=out.num_cached_tokens,
        # default=str: nothing in extra is dropped, at worst it arrives as its repr.
        extra_json=json.dumps(out.extra, default=str) if out.extra else "",
    )
    if out.prompt is not None:
        msg.prompt = out.prompt
    if out.prompt_logprobs is not None:
        msg.prompt_logprobs.CopyFrom(_positions_to_pb(out.prompt_logprobs))
    if out.metrics is not None:
        msg.metrics.CopyFrom(metrics_to_pb(out.metrics))
    if out.error is not None:
        msg.error = out.error
    if out.lora_request is not None:
        msg.lora_request.CopyFrom(lora_request_to_pb(out.lora_request))
    return msg


def request_output_from_pb(msg: pb.RequestOutput) -> RequestOutput:
    prompt_logprobs: PromptLogprobs | None = None
    if msg.HasField("prompt_logprobs"):
        prompt_logprobs = [_position_from_pb(p) for p in msg.prompt_logprobs.positions]
    return RequestOutput(
        request_id=msg.request_id,
        prompt=msg.prompt if msg.HasField("prompt") else None,
        prompt_token_ids=list(msg.prompt_token_ids),
        outputs=[completion_from_pb(c) for c in msg.outputs],
        finished=msg.finished,
        prompt_logprobs=prompt_logprobs,
        num_cached_tokens=msg.num_cached_tokens,
        metrics=metrics_from_pb(msg.metrics) if msg.HasField("metrics") else None,
        error=msg.error if msg.HasField("error") else None,
        extra=json.loads(msg.extra_json) if msg.extra_json else {},
        lora_request=optional_lora_from_pb(msg),
    )


def pooling_output_to_pb(out: PoolingRequestOutput) -> pb.RequestOutput:
    msg = pb.RequestOutput(request_id=out.request_id, prompt_token_ids=out.prompt_token_ids,
                           finished=out.finished, num_cached_tokens=out.num_cached_tokens,
                           embedding=pb.Embedding(values=out.outputs.values))
    if out.prompt is not None:
        msg.prompt = out.prompt
    if out.metrics is not None:
        msg.metrics.CopyFrom(metrics_to_pb(out.metrics))
    return msg


def any_output_from_pb(msg: pb.RequestOutput) -> RequestOutput | PoolingRequestOutput:
    """A generated output, or an embedding request's (its `embedding` set)."""
    if not msg.HasField("embedding"):
        return request_output_from_pb(msg)
    return PoolingRequestOutput(
        request_id=msg.request_id, outputs=PoolingOutput(list(msg.embedding.values)),
        prompt_token_ids=list(msg.prompt_token_ids), finished=msg.finished,
        num_cached_tokens=msg.num_cached_tokens,
        prompt=msg.prompt if msg.HasField("prompt") else None,
        metrics=metrics_from_pb(msg.metrics) if msg.HasField("metrics") else None)
