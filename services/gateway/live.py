"""What the gateway remembers about a request between AddRequest and its end."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from opentelemetry.trace import Span, Status, StatusCode

from services._proto.strand.v1 import types_pb2 as pb

# A Generate stream receives RequestOutputs, then None when the request ends without one.
StreamQueue = asyncio.Queue[pb.RequestOutput | None]


@dataclass(slots=True)
class LiveRequest:
    request_id: str  # the internal id: the owner's client tag and the client's own id
    child_ids: list[str]
    span: Span  # the llm_request span, ended when the request ends
    cumulative: bool  # output_kind CUMULATIVE: token_ids are totals, not deltas
    num_prompt_tokens: int
    final_only: bool = False  # output_kind FINAL_ONLY: nothing to stream before the end
    queue: StreamQueue | None = None  # set for Generate requests
    num_outputs: int = 1  # n: the completions of its RequestOutputs
    aborted: bool = False  # by an Abort call (maybe while the stages were still taking it)
    num_completion_tokens: dict[int, int] = field(default_factory=dict)  # per output index
    start: float = field(default_factory=time.time)
    client: str = ""  # the identity of the client that added it (services/gateway/clients.py)
    public_id: str = ""  # the id its client gave: what the client sees in every output

    def record(self, output: pb.RequestOutput) -> None:
        for completion in output.outputs:
            n = len(completion.token_ids)
            if self.cumulative:
                self.num_completion_tokens[completion.index] = n
            else:
                self.num_completion_tokens[completion.index] = (
                    self.num_completion_tokens.get(completion.index, 0) + n)

    def end_span(self, output: pb.RequestOutput | None, finish_reason: str) -> None:
        """gen_ai.* attributes from the final output, then end the llm_request span."""
        span = self.span
        span.set_attribute("gen_ai.usage.prompt_tokens", self.num_prompt_tokens)
        span.set_attribute("gen_ai.usage.completion_tokens",
                           sum(self.num_completion_tokens.values()))
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        if output is not None and output.HasField("metrics"):
            m = output.metrics
            end = m.finished_time if m.HasField("finished_time") else time.time()
            span.set_attribute("gen_ai.latency.e2e", end - m.arrival_time)
            if m.HasField("first_scheduled_time"):
                span.set_attribute("gen_ai.latency.time_in_queue",
                                   m.first_scheduled_time - m.arrival_time)
            if m.HasField("first_token_time"):
                span.set_attribute("gen_ai.latency.time_to_first_token",
                                   m.first_token_time - m.arrival_time)
        else:
            span.set_attribute("gen_ai.latency.e2e", time.time() - self.start)
        if finish_reason == "error":
            span.set_status(Status(StatusCode.ERROR, output.error if output else "error"))
        span.end()


def finish_reason_of(output: pb.RequestOutput) -> str:
    reasons = [c.finish_reason for c in output.outputs if c.HasField("finish_reason")]
    if "error" in reasons:
        return "error"
    return reasons[0] if reasons else "stop"


def error_output(request_id: str, num_outputs: int, reason: str) -> pb.RequestOutput:
    """The gateway's own last word for a request whose detokenizer state was lost."""
    return _final_output(request_id, num_outputs, "error", reason)


def abort_output(request_id: str, num_outputs: int) -> pb.RequestOutput:
    """The last output of an aborted Generate stream (vLLM ends its streams so too)."""
    return _final_output(request_id, num_outputs, "abort", "")


def _final_output(request_id: str, num_outputs: int, reason: str, error: str
                  ) -> pb.RequestOutput:
    output = pb.RequestOutput(
        request_id=request_id, finished=True,
        outputs=[pb.CompletionOutput(index=i, finish_reason=reason) for i in range(num_outputs)])
    if error:
        output.error = error
    return output
