"""What a user gets back: RequestOutput with one CompletionOutput per sample (vLLM's shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Self, TypeVar

from strand.engine_core.lora.request import LoRARequest

if TYPE_CHECKING:  # the tokenizer and detokenizer stages load no torch
    import torch


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = the most likely token
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (top-k plus the sampled/prompt token).
SampleLogprobs = list[dict[int, Logprob]]
# The first prompt position has no logprob (nothing precedes it): None there.
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    preemption_times: list[float] = field(default_factory=list)  # every preemption so far

    def snapshot(self) -> RequestMetrics:
        """A copy with its own preemption list, for a RequestOutput the caller keeps while the
        request goes on (positional: dataclasses.replace costs 5 us a call, once per request
        and step)."""
        return RequestMetrics(self.arrival_time, self.first_scheduled_time, self.first_token_time,
                              self.last_token_time, self.finished_time,
                              list(self.preemption_times))

    @property
    def time_in_queue(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None  # "stop", "length", "abort", "error"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, later: CompletionOutput) -> None:
        """A later DELTA of this sample appended: its text, tokens and logprobs follow ours."""
        self.text += later.text
        self.token_ids = [*self.token_ids, *later.token_ids]  # ours may be shared with a caller
        if later.logprobs:
            self.logprobs = [*(self.logprobs or []), *later.logprobs]
        self.cumulative_logprob = later.cumulative_logprob
        self.finish_reason = later.finish_reason
        self.stop_reason = later.stop_reason


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    error: str | None = None  # set with finish_reason "error": why the request ended
    extra: dict[str, object] = field(default_factory=dict)
    lora_request: LoRARequest | None = None  # the adapter it ran with (vLLM's field)

    def add(self, next_output: RequestOutput, aggregate: bool) -> None:
        """Merge a later output of the same request into this one (vLLM's RequestOutput.add).

        aggregate (DELTA outputs): each completion's text, token ids and logprobs are appended,
        so nothing is lost; otherwise (CUMULATIVE, FINAL_ONLY: each carries everything) a
        completion is replaced by its later self. Completions match by index: with n > 1 a
        streamed output carries only the samples that moved, and the others stay.
        """
        self.finished |= next_output.finished
        for completion in next_output.outputs:
            for i, mine in enumerate(self.outputs):
                if mine.index == completion.index:
                    if aggregate:
                        mine.append(completion)
                    else:
                        self.outputs[i] = completion
                    break
            else:
                self.outputs.append(completion)
        # New lists and dicts, as CompletionOutput.append makes: ours may be shared with a caller.
        if next_output.prompt_logprobs is not None:
            if aggregate and self.prompt_logprobs is not None:  # positions computed later
                self.prompt_logprobs = [*self.prompt_logprobs, *next_output.prompt_logprobs]
            else:
                self.prompt_logprobs = next_output.prompt_logprobs
        self.num_cached_tokens = next_output.num_cached_tokens
        self.metrics = next_output.metrics or self.metrics  # the later times
        self.error = next_output.error or self.error
        if next_output.extra:
            self.extra = {**self.extra, **next_output.extra}


@dataclass(slots=True)
class PoolingOutput:
    """The embedding as floats: what travels between the stages, which load no torch."""

    values: list[float]

    @property
    def data(self) -> torch.Tensor:
        """vLLM's field: the embedding as a [hidden_size] float32 tensor."""
        import torch

        return torch.tensor(self.values, dtype=torch.float32)


@dataclass(slots=True)
class PoolingRequestOutput:
    """An embedding request's one output (vLLM's shape): step() returns it when the prompt
    was computed."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True
    num_cached_tokens: int = 0
    prompt: str | None = None
    metrics: RequestMetrics | None = None


@dataclass(slots=True)
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


T = TypeVar("T")


@dataclass(slots=True)
class TaskRequestOutput(Generic[T]):
    """LLM.embed's, classify's and score's result per prompt or pair (vLLM's
    PoolingRequestOutput[T]): the task's own output beside the request's ids."""

    request_id: str
    outputs: T
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def of(cls, base: PoolingRequestOutput, outputs: T) -> Self:
        return cls(base.request_id, outputs, base.prompt_token_ids, base.finished)


class EmbeddingRequestOutput(TaskRequestOutput[EmbeddingOutput]):
    """LLM.embed's: the embedding as a list of floats."""

    __slots__ = ()

    @classmethod
    def from_base(cls, output: PoolingRequestOutput) -> EmbeddingRequestOutput:
        return cls.of(output, EmbeddingOutput(output.outputs.values))


@dataclass(slots=True)
class ClassificationOutput:
    probs: list[float]  # per label, in the model's id2label order (logits: use_activation=False)

    @property
    def num_classes(self) -> int:
        return len(self.probs)


class ClassificationRequestOutput(TaskRequestOutput[ClassificationOutput]):
    """LLM.classify's: each label's probability."""

    __slots__ = ()

    @classmethod
    def from_base(cls, output: PoolingRequestOutput) -> ClassificationRequestOutput:
        return cls.of(output, ClassificationOutput(output.outputs.values))


@dataclass(slots=True)
class ScoringOutput:
    score: float


class ScoringRequestOutput(TaskRequestOutput[ScoringOutput]):
    """LLM.score's, per text pair: a cross-encoder's relevance, or the cosine similarity of an
    embedding model's two embeddings."""

    __slots__ = ()
