"""ParentRequest: one user request, fanned out into n independently sampled children."""

from __future__ import annotations

from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreRequest
from strand.engine_core.outputs import (
    PoolingOutput,
    PoolingRequestOutput,
    RequestMetrics,
    RequestOutput,
)
from strand.engine_core.processing.input_processor import ProcessedPrompt
from strand.engine_core.processing.request_state import SequenceState
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import RequestOutputKind


def child_request_id(index: int, request_id: str) -> str:
    return f"{index}_{request_id}"


def fan_out(request: EngineCoreRequest) -> list[EngineCoreRequest]:
    """The requests the core runs for one user request: itself when n == 1, else n children
    ("0_x", "1_x", ...), each sampling once. A pure function of the request, so the tokenizer
    (which sends them to the engine) and the detokenizer (which gathers their outputs) agree on
    the children without asking each other."""
    params = request.sampling_params
    if params.n == 1:
        return [request]
    # Each child gets its own seed, else the n samples would all be the same.
    return [EngineCoreRequest(
        request_id=child_request_id(i, request.request_id),
        prompt_token_ids=request.prompt_token_ids,
        sampling_params=params.clone(n=1, seed=None if params.seed is None else params.seed + i),
        eos_token_id=request.eos_token_id,
        arrival_time=request.arrival_time,
        priority=request.priority,
        cache_salt=request.cache_salt,
        lora_request=request.lora_request,
        deadline=request.deadline,
    ) for i in range(params.n)]


class ParentRequest:
    def __init__(self, processed: ProcessedPrompt, tokenizer: Tokenizer | None,
                 stream_interval: int = 1) -> None:
        request = processed.request
        self.stream_interval = stream_interval
        params = request.sampling_params
        self.request_id = request.request_id
        self.prompt = processed.prompt
        self.prompt_token_ids = list(request.prompt_token_ids)
        self.output_kind = params.output_kind
        self.metrics = RequestMetrics(arrival_time=request.arrival_time)
        self.num_cached_tokens = 0
        self.lora_request = request.lora_request
        self.child_requests = fan_out(request)
        self.children = {
            child.request_id: SequenceState(
                child.request_id, i, tokenizer, self.prompt_token_ids, child.sampling_params
            )
            for i, child in enumerate(self.child_requests)
        }
        # Every child computes the same prompt logprobs; the first child's are reported.
        self._first = next(iter(self.children.values()))
        # An embedding request's result, once the core sent it (runner="pooling").
        self.embedding: list[float] | None = None

    @property
    def finished(self) -> bool:
        if len(self.children) == 1:  # n=1, nearly every request: asked several times a step
            return self._first.finished
        return all(child.finished for child in self.children.values())

    def unfinished_child_ids(self) -> list[str]:
        return [cid for cid, child in self.children.items() if not child.finished]

    def update(self, output: EngineCoreOutput, timestamp: float) -> bool:
        """Apply one child's step; True when a stop string ended it (the core must abort it)."""
        metrics = self.metrics
        if metrics.first_scheduled_time is None:
            metrics.first_scheduled_time = output.first_scheduled_time
        if output.preempted_times:
            metrics.preemption_times.extend(output.preempted_times)
        if output.new_token_ids:
            held = output.held_times or []
            if metrics.first_token_time is None:
                metrics.first_token_time = held[0] if held else timestamp
            # Held tokens of earlier steps lead; this step's own follow (if any).
            own = len(output.new_token_ids) > len(held)
            metrics.last_token_time = timestamp if own else held[-1]
        self.num_cached_tokens = max(self.num_cached_tokens, output.num_cached_tokens)
        if output.pooling_output is not None:
            self.embedding = output.pooling_output
        needs_abort = self.children[output.request_id].update(output)
        if self.finished:
            metrics.finished_time = timestamp
        return needs_abort

    def finish_unfinished(self, reason: str, timestamp: float) -> None:
        for child in self.children.values():
            if not child.finished:
                child.finish(reason)
        self.metrics.finished_time = timestamp

    def pooled_output(self) -> PoolingRequestOutput | None:
        """An embedding request's one output, once the core sent its embedding."""
        if self.embedding is None:
            return None
        return PoolingRequestOutput(self.request_id, PoolingOutput(self.embedding),
                                    self.prompt_token_ids, True, self.num_cached_tokens,
                                    self.prompt, self.metrics.snapshot())

    def make_output(self, error: str | None = None) -> RequestOutput | None:
        """This step's RequestOutput under the request's output_kind; None when nothing to say
        (or an embedding: pooled_output)."""
        finished = self.finished
        if self.embedding is not None:
            return None
        kind = self.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        delta = kind == RequestOutputKind.DELTA
        children = ([self._first] if len(self.children) == 1
                    else sorted(self.children.values(), key=lambda c: c.index))
        if kind != RequestOutputKind.FINAL_ONLY:
            # Streaming (DELTA or CUMULATIVE): the children that produced output this step,
            # as vLLM's ParentRequest streams them; FINAL_ONLY gathers all n at the end.
            children = [c for c in children if c.ready_to_stream(self.stream_interval)]
        if not children:
            return None
        outputs = [child.completion(delta) for child in children]
        source = self._first.logprobs
        if delta:
            prompt_logprobs = source.take_new_prompt_logprobs()
        else:
            prompt_logprobs = None if source.prompt_logprobs is None else list(
                source.prompt_logprobs
            )
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=self.num_cached_tokens,
            metrics=self.metrics.snapshot(),  # later steps update ours
            error=error,
            lora_request=self.lora_request,
        )
