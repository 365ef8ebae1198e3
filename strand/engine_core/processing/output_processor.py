"""OutputProcessor: EngineCoreOutputs -> RequestOutputs (the detokenizer stage).

Life of a request here: add_request registers the parent and returns the children for the core;
each engine step, process_outputs detokenizes the new tokens, checks stop strings, gathers the n
children into one RequestOutput per parent, and drops the parent once every child has finished.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreRequest
from strand.engine_core.errors import DuplicateRequestError
from strand.engine_core.metrics.request_metrics import RequestStatsRecorder
from strand.engine_core.outputs import PoolingRequestOutput, RequestOutput
from strand.engine_core.processing.input_processor import ProcessedPrompt
from strand.engine_core.processing.parallel_sampling import ParentRequest
from strand.engine_core.processing.tokenizer import Tokenizer

# How many ended request ids (children) recently_ended remembers.
ENDED_MEMORY = 65536


@dataclass(slots=True)
class OutputProcessorResult:
    # One per parent request with something to report this step (respecting its output_kind).
    request_outputs: list[RequestOutput] = field(default_factory=list)
    # Embedding requests (runner="pooling") that finished this step.
    pooling_outputs: list[PoolingRequestOutput] = field(default_factory=list)
    # Child ids ended here by a stop string while the core still runs them: abort them there.
    reqs_to_abort: list[str] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None, stream_interval: int = 1,
                 stats: RequestStatsRecorder | None = None) -> None:
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        self.tokenizer = tokenizer
        # Streaming requests get an output every stream_interval tokens (vLLM's EngineArgs).
        self.stream_interval = stream_interval
        self.stats = stats  # per-request Prometheus metrics; None records none
        self._parents: dict[str, ParentRequest] = {}
        self._parent_of_child: dict[str, ParentRequest] = {}
        # Child ids ended here while the core may still run them (aborted, stopped by a stop
        # string, failed), newest last, so a late output of one is known for what it is (the
        # detokenizer drops it instead of waiting for its request to arrive). A child the core
        # itself finished sends nothing more: it is not here, and its id may be reused at once.
        self._ended: OrderedDict[str, None] = OrderedDict()

    def has_request(self, request_id: str) -> bool:
        """True while the id names a live request, or one of its children, here."""
        return request_id in self._parents or request_id in self._parent_of_child

    def recently_ended(self, request_id: str) -> bool:
        """True when the child id ended here while the core may still have run it (aborted,
        stopped by a stop string, failed), among the last ENDED_MEMORY that did, and was not
        added again since."""
        return request_id in self._ended

    def add_request(self, processed: ProcessedPrompt) -> list[EngineCoreRequest]:
        """Register the parent; return the child requests to send to the core."""
        request_id = processed.request.request_id
        if not isinstance(request_id, str):
            raise ValueError(f"request_id must be a str, got {type(request_id).__name__}")
        parent = ParentRequest(processed, self.tokenizer, self.stream_interval)
        # A child id of the new request ("0_x") may collide with a live id as well.
        for rid in (request_id, *parent.children):
            if self.has_request(rid):
                raise DuplicateRequestError(f"request_id {rid!r} already in use")
        self._parents[request_id] = parent
        for child_id in parent.children:
            self._parent_of_child[child_id] = parent
            self._ended.pop(child_id, None)
        return list(parent.child_requests)

    def process_outputs(
        self, outputs: list[EngineCoreOutput], iteration_timestamp: float | None = None
    ) -> OutputProcessorResult:
        timestamp = time.time() if iteration_timestamp is None else iteration_timestamp
        result = OutputProcessorResult()
        touched: dict[str, ParentRequest] = {}
        for output in outputs:
            parent = self._parent_of_child.get(output.request_id)
            # Aborted here, or already ended by a stop string: vLLM reports nothing more for it.
            if parent is None or parent.children[output.request_id].finished:
                continue
            previous_token_time = parent.metrics.last_token_time
            if output.held_times and previous_token_time is not None:
                previous_token_time = self._record_held_steps(previous_token_time,
                                                              output.held_times)
            if parent.update(output, timestamp):
                result.reqs_to_abort.append(output.request_id)
            touched[parent.request_id] = parent
            if self.stats is not None and output.new_token_ids:
                self._record_token_step(parent, previous_token_time)
        for parent in touched.values():
            request_output = parent.make_output()
            if request_output is not None:
                result.request_outputs.append(request_output)
            pooled = parent.pooled_output() if parent.finished else None
            if pooled is not None:
                result.pooling_outputs.append(pooled)
            if parent.finished:
                self._record_finished(parent)
                self._remove(parent, result.reqs_to_abort)
        return result

    def _record_held_steps(self, previous: float, times: list[float]) -> float:
        """The inter-token latencies of steps whose tokens the engine stage held (each would
        have been recorded on its own step); returns the last of their times."""
        latencies = []
        for current in times:
            if current > previous:  # tokens of one step (n > 1's siblings) count once
                latencies.append(current - previous)
                previous = current
        if self.stats is not None:
            self.stats.next_tokens(latencies)
        return previous

    def _record_token_step(self, parent: ParentRequest, previous: float | None) -> None:
        assert self.stats is not None
        current = parent.metrics.last_token_time
        if previous is None:
            self.stats.first_token(parent.metrics)
        elif current is not None and current > previous:
            # n > 1: the siblings' tokens of the same step have the same time; counted once.
            self.stats.next_token(previous, current)

    def _record_finished(self, parent: ParentRequest) -> None:
        if self.stats is not None:
            children = parent.children.values()
            self.stats.finished(parent.metrics, len(parent.prompt_token_ids),
                                [len(c.token_ids) for c in children],
                                [c.finish_reason for c in children])

    def abort_requests(self, request_ids: Iterable[str], count_as_aborted: bool = True
                       ) -> list[str]:
        """Drop the requests (no further output); return the child ids the core must abort.

        A child id drops its whole parent: a parent's output needs all n of its children.
        count_as_aborted=False: taking back a request the core refused (not an abort in the
        metrics: it never ran).
        """
        to_abort: list[str] = []
        for request_id in request_ids:
            parent = self._parents.get(request_id) or self._parent_of_child.get(request_id)
            if parent is None or parent.request_id not in self._parents:
                continue
            unfinished = parent.unfinished_child_ids()
            to_abort.extend(unfinished)
            if self.stats is not None and count_as_aborted:
                parent.finish_unfinished("abort", time.time())
                self._record_finished(parent)
            self._remove(parent, unfinished)
        return to_abort

    def finish_with_error(self, request_ids: Iterable[str], reason: str
                          ) -> list[RequestOutput]:
        """End the requests with finish_reason "error" and RequestOutput.error = reason."""
        timestamp = time.time()
        request_outputs: list[RequestOutput] = []
        for request_id in request_ids:
            parent = self._parents.get(request_id) or self._parent_of_child.get(request_id)
            if parent is None or parent.request_id not in self._parents:
                continue
            parent.finish_unfinished("error", timestamp)
            request_output = parent.make_output(error=reason)
            if request_output is not None:
                request_outputs.append(request_output)
            self._record_finished(parent)
            self._remove(parent, list(parent.children))
        return request_outputs

    def get_num_unfinished_requests(self) -> int:
        return len(self._parents)

    def has_unfinished_requests(self) -> bool:
        return bool(self._parents)

    def _remove(self, parent: ParentRequest, still_in_core: Iterable[str]) -> None:
        self._parents.pop(parent.request_id, None)
        for child_id in parent.children:
            self._parent_of_child.pop(child_id, None)
        for child_id in still_in_core:
            if child_id in parent.children:
                self._ended[child_id] = None
                self._ended.move_to_end(child_id)
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)
