"""PoolingParams: what a pooling request asks; how the model pools is PoolerConfig
(strand/engine_core/pooler_config.py, plain data beside EngineArgs).

vLLM's names and defaults: a decoder model served with runner="pooling" embeds a prompt as the
final-norm hidden state of its last token ("LAST"), L2-normalised. pooler_config may ask for the
mean over the prompt's tokens ("MEAN") or its first token ("CLS") instead, and normalize=False.
A sequence classifier (*ForSequenceClassification) runs that row through its score layer and
gives each label's probability: softmax over the labels, a sigmoid for a single one (a
cross-encoder's relevance score).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from strand.engine_core.pooler_config import PoolerConfig
from strand.engine_core.pooling.sentence_transformers import pooler_defaults
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams

if TYPE_CHECKING:  # the tokenizer and detokenizer stages load no torch
    import torch

    from strand.engine_core.model_executor.model_config import ModelConfig

# vLLM's pooling tasks: "score" is a cross-encoder's "classify" of a text pair (one label).
POOLING_TASKS = ("embed", "classify", "score")


@dataclass(slots=True)
class PoolingParams:
    """vLLM's PoolingParams for LLM.embed / LLM.classify / LLM.score and the pooling
    endpoints."""

    # Keep only the last k prompt tokens (-1: the last max_model_len), as SamplingParams' own.
    truncate_prompt_tokens: int | None = None
    # Matryoshka output width: the embedding's first `dimensions` values, normalized after;
    # refused (as vLLM refuses it) for a model not trained for it.
    dimensions: int | None = None
    # None: the engine's pooler_config.normalize.
    normalize: bool | None = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY
    # "embed" | "classify" | "score"; None: the model's own (resolve()).
    task: str | None = None
    # classify / score: softmax over the labels (a sigmoid for one); False: the raw logits.
    # None: True.
    use_activation: bool | None = None

    def __post_init__(self) -> None:
        keep = self.truncate_prompt_tokens
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int)
                                 or (keep < 1 and keep != -1)):
            raise ValueError(f"truncate_prompt_tokens must be >= 1 or -1, got {keep!r}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be a bool or None, got {self.normalize!r}")
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {list(POOLING_TASKS)}, got {self.task!r}")
        if self.use_activation is not None and not isinstance(self.use_activation, bool):
            raise ValueError(f"use_activation must be a bool or None, got "
                             f"{self.use_activation!r}")
        self._check_task_fields(self.task)
        dims = self.dimensions
        if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
            raise ValueError(f"dimensions must be an integer >= 1 or None, got {dims!r}")

    def _check_task_fields(self, task: str | None) -> None:
        """vLLM's: each task takes its own fields only."""
        if task in ("classify", "score") and self.dimensions is not None:
            raise ValueError(f"dimensions applies to task 'embed', not {task!r}")
        if task == "embed" and self.use_activation is not None:
            raise ValueError("use_activation applies to task 'classify' or 'score', not 'embed' "
                             "(an embedding takes normalize)")
        if task in ("classify", "score") and self.normalize is not None:
            raise ValueError(f"normalize applies to task 'embed', not {task!r} (a "
                             "classifier takes use_activation)")

    def resolve(self, pooler: PoolerConfig) -> None:
        """Fill what the request left to the engine (its task, normalize); ValueError when the
        task is not one the model's pooler does."""
        task = self.task or pooler.task
        if task == "embed" and pooler.num_labels:
            raise ValueError(f"task 'embed' is not supported by this model: it is a sequence "
                             f"classifier ({pooler.num_labels} labels), which does 'classify' "
                             f"and 'score' (LLM.classify, LLM.score)")
        if task in ("classify", "score") and not pooler.num_labels:
            raise ValueError(f"task {task!r} needs a sequence classifier (a "
                             f"*ForSequenceClassification model); this model embeds: use task "
                             f"'embed' (LLM.score of an embedding model compares embeddings)")
        if task == "score" and pooler.num_labels != 1:
            raise ValueError(f"task 'score' needs a classifier with one label (a cross-encoder), "
                             f"this one has {pooler.num_labels}: use task 'classify'")
        self._check_task_fields(task)
        if self.dimensions is not None:
            _check_dimensions(self.dimensions, pooler)
        self.task = task  # checked first: a refused request's params are left as they came
        if task == "embed" and self.normalize is None:  # the request's own, else the engine's
            self.normalize = pooler.normalize

    def finish(self, pooled: torch.Tensor, activation: str = "softmax") -> torch.Tensor:
        """The pooled vector as the request asked. An embedding: L2-normalised unless normalize
        is False. A classifier's logits: through the model's activation (PoolerConfig's:
        softmax, or a sigmoid for one label) unless use_activation is False."""
        if self.task in ("classify", "score"):
            if self.use_activation is False or activation == "identity":
                return pooled
            return pooled.sigmoid() if activation == "sigmoid" else pooled.softmax(dim=-1)
        if self.dimensions is not None:  # matryoshka: the leading values, normalized after
            pooled = pooled[:self.dimensions]
        if self.normalize is False:
            return pooled
        return pooled / pooled.norm().clamp_min(1e-12)  # torch's F.normalize

    def clone(self) -> PoolingParams:
        return PoolingParams(self.truncate_prompt_tokens, self.dimensions, self.normalize,
                             self.output_kind, self.task, self.use_activation)

    def carrier(self) -> SamplingParams:
        """What the request carries through the scheduler's and runner's sampling paths: one
        step past its prompt at most, never sampled (the runner pools its rows instead), never
        detokenized."""
        return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                              truncate_prompt_tokens=self.truncate_prompt_tokens,
                              output_kind=RequestOutputKind.FINAL_ONLY)


def check_runner_fits(pooling_params: PoolingParams | None, runner: str) -> None:
    """ValueError when a request's kind is not what the engine's runner does."""
    if runner == "pooling" and pooling_params is None:
        raise ValueError("params must be a PoolingParams: this engine's runner is 'pooling', "
                         "which embeds prompts (LLM.embed); start one with runner='generate' "
                         "to generate")
    if runner != "pooling" and pooling_params is not None:
        raise ValueError(f"params is a PoolingParams, but this engine's runner is {runner!r}: "
                         "start it with runner='pooling' (--runner pooling) to embed")


def _check_dimensions(dimensions: int, pooler: PoolerConfig) -> None:
    """vLLM's checks of a matryoshka width, against what the model was trained for."""
    if not pooler.is_matryoshka:
        raise ValueError(f"dimensions must be unset: the model does not support matryoshka "
                         f"representation (config.json has no is_matryoshka or "
                         f"matryoshka_dimensions), and changing the output dimensions "
                         f"({dimensions}) would give poor embeddings")
    if pooler.matryoshka_dimensions and dimensions not in pooler.matryoshka_dimensions:
        raise ValueError(f"dimensions must be one of {list(pooler.matryoshka_dimensions)} (the "
                         f"model's matryoshka_dimensions), got {dimensions}")
    if pooler.hidden_size and dimensions > pooler.hidden_size:
        raise ValueError(f"dimensions must be <= the model's hidden_size "
                         f"({pooler.hidden_size}), got {dimensions}")


def pooler_for_model(runner: str, pooler_config: dict[str, Any] | None,
                     model: ModelConfig) -> PoolerConfig | None:
    """The engine's pooler: pooler_config over the model directory's sentence-transformers
    pooling (an embedding model's), with what the model says of its outputs (a classifier's
    labels and activation, matryoshka widths). None for a generating runner; ValueError for a
    sequence classifier there, which has no LM head to generate with."""
    num_labels = model.num_labels
    if runner != "pooling":
        if num_labels:
            raise ValueError(f"this model is a sequence classifier ({num_labels} labels, a "
                             "*ForSequenceClassification checkpoint) and generates no text: "
                             "start it with runner='pooling' (--runner pooling) to classify "
                             "and score (LLM.classify, LLM.score)")
        return None
    defaults = {} if num_labels else pooler_defaults(model.model_dir)
    return replace(PoolerConfig.from_dict({**defaults, **(pooler_config or {})}),
                   num_labels=num_labels, activation=model.activation,
                   is_matryoshka=model.is_matryoshka,
                   matryoshka_dimensions=model.matryoshka_dimensions,
                   hidden_size=model.hidden_size)
