"""What the gateway remembers about a request between AddRequest and its end."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from opentelemetry.trace import Span

from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.gateway.metrics import GatewayMetrics
from strand.services.gateway.request_span import (
    add_first_token_event,
    add_preemption_events,
    end_request_span,
)
from strand.services.gateway.stream_outputs import StreamOutputs


@dataclass(slots=True)
class LiveRequest:
    request_id: str  # the internal id: the owner's client tag and the client's own id
    child_ids: list[str]
    span: Span  # the llm_request span, ended when the request ends
    cumulative: bool  # output_kind CUMULATIVE: token_ids are totals, not deltas
    num_prompt_tokens: int
    final_only: bool = False  # output_kind FINAL_ONLY: nothing to stream before the end
    queue: StreamOutputs | None = None  # set for Generate requests
    num_outputs: int = 1  # n: the completions of its RequestOutputs
    aborted: bool = False  # by an Abort call (maybe while the stages were still taking it)
    num_completion_tokens: dict[int, int] = field(default_factory=dict)  # per output index
    finish_reasons: dict[int, str] = field(default_factory=dict)  # per output index, as they end
    start: float = field(default_factory=time.time)
    client: str = ""  # the identity of the client that added it (strand/services/gateway/clients.py)
    public_id: str = ""  # the id its client gave: what the client sees in every output
    metrics: GatewayMetrics | None = None
    has_tokens: bool = False  # an output with tokens has arrived
    num_preemptions: int = 0  # the engine's preemptions of it, as outputs reported them
    last_output_at: float = field(default_factory=time.monotonic)  # added, or its last output

    def record(self, output: pb.RequestOutput) -> None:
        self.last_output_at = time.monotonic()
        if not self.num_prompt_tokens and output.prompt_token_ids:
            # In auto mode a short request can finish before the tokenizer's answer (which
            # also carries the count) is back: its outputs say it first.
            self.num_prompt_tokens = len(output.prompt_token_ids)
        for completion in output.outputs:
            n = len(completion.token_ids)
            if self.cumulative:
                self.num_completion_tokens[completion.index] = n
            else:
                self.num_completion_tokens[completion.index] = (
                    self.num_completion_tokens.get(completion.index, 0) + n)
            if completion.HasField("finish_reason"):
                self.finish_reasons.setdefault(completion.index, completion.finish_reason)
        self.num_preemptions = add_preemption_events(self.span, output, self.num_preemptions)
        if not self.has_tokens and any(c.token_ids for c in output.outputs):
            self.has_tokens = True
            add_first_token_event(self.span, output)
            if self.metrics is not None:
                self.metrics.first_output.observe(max(0.0, time.time() - self.start))

    def end_span(self, output: pb.RequestOutput | None, finish_reason: str) -> None:
        """gen_ai.* attributes, then end the llm_request span (and count the request).
        Completions that had not ended take finish_reason (an abort, a lost stage)."""
        for index in range(self.num_outputs):
            self.finish_reasons.setdefault(index, finish_reason)
        self.span.set_attribute("strand.request.num_preemptions", self.num_preemptions)
        end_request_span(self.span, self.request_id, self.num_prompt_tokens,
                         sum(self.num_completion_tokens.values()), self.finish_reasons,
                         output, self.start)
        if self.metrics is not None:
            reasons = [self.finish_reasons[i] for i in sorted(self.finish_reasons)]
            self.metrics.finished(reasons, time.time() - self.start)


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
