"""LLM: offline batch generation over LLMEngine, with a progress bar (vLLM's `LLM.generate`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from strand.engine_core.config import EngineArgs
from strand.engine_core.llm_engine import LLMEngine, PromptType
from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringRequestOutput,
)
from strand.engine_core.pooling.params import POOLING_TASKS, PoolingParams
from strand.engine_core.pooling.scoring import (
    cross_encoder_prompt,
    cross_encoder_score,
    distinct,
    embedding_score,
    pair_up,
)
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams


class LLM:
    def __init__(self, model: str | None = None, **engine_kwargs: Any) -> None:
        self.engine = LLMEngine.from_engine_args(EngineArgs(model=model, **engine_kwargs))
        self._counter = 0

    def get_tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """All prompts in, one finished RequestOutput per prompt out, in the prompts' order.
        lora_request: one adapter for every prompt, or one (or None) per prompt. priority: one
        per prompt (vLLM's; lower first, with scheduling_policy "priority")."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params_list = [p.clone(output_kind=RequestOutputKind.FINAL_ONLY)
                       for p in _broadcast(sampling_params, len(prompts))]
        outputs = self._run(prompts, params_list, lora_request, priority, use_tqdm)
        return [o for o in outputs if isinstance(o, RequestOutput)]

    def embed(self, prompts: PromptType | Sequence[PromptType],
              pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = True,
              lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
              ) -> list[EmbeddingRequestOutput]:
        """vLLM's LLM.embed: one embedding per prompt, in the prompts' order (an engine built
        with runner="pooling"). truncate_prompt_tokens: keep each prompt's last k tokens."""
        return [EmbeddingRequestOutput.from_base(output) for output in self.encode(
            prompts, pooling_params, truncate_prompt_tokens, use_tqdm, lora_request, "embed")]

    def classify(self, prompts: PromptType | Sequence[PromptType],
                 pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
                 truncate_prompt_tokens: int | None = None, use_tqdm: bool = True,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
                 ) -> list[ClassificationRequestOutput]:
        """vLLM's LLM.classify: each prompt's label probabilities (a *ForSequenceClassification
        model with runner="pooling")."""
        return [ClassificationRequestOutput.from_base(output) for output in self.encode(
            prompts, pooling_params, truncate_prompt_tokens, use_tqdm, lora_request, "classify")]

    def score(self, data_1: PromptType | Sequence[PromptType],
              data_2: PromptType | Sequence[PromptType],
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = True,
              pooling_params: PoolingParams | None = None,
              lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
              ) -> list[ScoringRequestOutput]:
        """vLLM's LLM.score: one score per (data_1, data_2) pair, 1:1, 1:N or N:N. A
        cross-encoder (one label) reads each text pair as one prompt; an embedding model
        compares the two texts' embeddings (cosine similarity)."""
        pairs = pair_up(data_1, data_2)
        if self.engine.engine_core.model_config.num_labels:
            prompts = [cross_encoder_prompt(a, b) for a, b in pairs]
            return [cross_encoder_score(output) for output in self.encode(
                prompts, pooling_params, truncate_prompt_tokens, use_tqdm, lora_request,
                "score")]
        texts, indices = distinct(pairs)
        embedded = self.encode(texts, pooling_params, truncate_prompt_tokens, use_tqdm,
                               lora_request, "embed")
        return [embedding_score(embedded[i], embedded[j]) for i, j in indices]

    def encode(self, prompts: PromptType | Sequence[PromptType],
               pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
               truncate_prompt_tokens: int | None = None, use_tqdm: bool = True,
               lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
               pooling_task: str | None = None) -> list[PoolingRequestOutput]:
        """vLLM's LLM.encode: each prompt's PoolingRequestOutput (outputs.data, a tensor).
        pooling_task: "embed", "classify" or "score"; None: the model's own."""
        if pooling_task is not None and pooling_task not in POOLING_TASKS:
            raise ValueError(f"pooling_task must be one of {list(POOLING_TASKS)}, got "
                             f"{pooling_task!r}")
        if self.engine.args.runner != "pooling":
            raise ValueError("LLM.embed(), classify(), score() and encode() need "
                             "runner='pooling' (vLLM's --runner pooling): this engine's runner "
                             f"is {self.engine.args.runner!r}")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            params_list = [pooling_params or PoolingParams()] * len(prompts)
        elif len(pooling_params) != len(prompts):
            raise ValueError(f"pooling_params must be one or one per prompt ({len(prompts)}), "
                             f"got {len(pooling_params)}")
        else:
            params_list = list(pooling_params)
        params_list = [_for_task(p, pooling_task, truncate_prompt_tokens) for p in params_list]
        pooled = []
        for output in self._run(prompts, params_list, lora_request, None, use_tqdm):
            if not isinstance(output, PoolingRequestOutput):  # failed (a rank went away)
                raise RuntimeError(f"request {output.request_id} ended without an embedding: "
                                   f"{output.error or output.outputs[0].finish_reason}")
            pooled.append(output)
        return pooled

    def _run(self, prompts: Sequence[PromptType],
             params_list: Sequence[SamplingParams | PoolingParams],
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None,
             priority: Sequence[int] | None, use_tqdm: bool
             ) -> list[RequestOutput | PoolingRequestOutput]:
        """Add every prompt (all or nothing), step until each finished; their final outputs in
        the prompts' order."""
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras: list[LoRARequest | None] = [lora_request] * len(prompts)
        else:
            loras = list(lora_request)
            if len(loras) != len(prompts):
                raise ValueError(f"lora_request must be one per prompt ({len(prompts)}), got "
                                 f"{len(loras)}")
        priorities = [0] * len(prompts) if priority is None else list(priority)
        if len(priorities) != len(prompts):
            raise ValueError(f"priority must be one per prompt ({len(prompts)}), got "
                             f"{len(priorities)}")
        ids: list[str] = []
        try:
            for prompt, params, lora, rank in zip(prompts, params_list, loras, priorities,
                                                  strict=True):
                request_id = f"offline-{self._counter}"
                self._counter += 1
                self.engine.add_request(request_id, prompt, params, lora_request=lora,
                                        priority=rank)
                ids.append(request_id)
        except Exception:
            # All or nothing (vLLM's LLM too): a bad prompt takes back the ones before it, which
            # would otherwise run in the engine with nobody waiting for them.
            self.engine.take_back_requests(ids)
            raise
        finished: dict[str, RequestOutput | PoolingRequestOutput] = {}
        with tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm,
                  unit="req") as bar:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
        return [finished[i] for i in ids]

    def chat(self, messages: list[dict[str, Any]] | Sequence[list[dict[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True,
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
             tools: list[dict[str, Any]] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             continue_final_message: bool = False) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role", "content"} messages, an
        assistant's with OpenAI's tool_calls, a tool's with its tool_call_id) or a list of them,
        each rendered with the model's chat template (and `tools`, OpenAI's function specs, and
        chat_template_kwargs, more template variables such as Qwen 3's enable_thinking), then
        generate(). continue_final_message (with add_generation_prompt False): the model
        continues the last message, a reply the caller began."""
        conversations = ([messages] if messages and isinstance(messages[0], dict)
                         else list(messages))
        extra: dict[str, Any] = {} if tools is None else {"tools": tools}
        if chat_template_kwargs is not None:
            extra["chat_template_kwargs"] = chat_template_kwargs
        if continue_final_message:  # the last message is continued, not answered
            extra["continue_final_message"] = True
        prompts: list[PromptType] = [{"messages": conversation,
                                      "add_generation_prompt": add_generation_prompt, **extra}
                                     for conversation in conversations]
        return self.generate(prompts, sampling_params, use_tqdm, lora_request)


def _broadcast(params: SamplingParams | Sequence[SamplingParams] | None,
               n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"sampling_params must be one or one per prompt ({n}), got {len(params)}")
    return list(params)


def _for_task(params: PoolingParams, task: str | None,
              truncate_prompt_tokens: int | None) -> PoolingParams:
    """A copy naming the task the method does; ValueError if params names another."""
    if task is not None and params.task is not None and params.task != task:
        raise ValueError(f"pooling_params.task is {params.task!r}, but this call does {task!r}")
    changes: dict[str, Any] = {"task": task or params.task}
    if truncate_prompt_tokens is not None:
        changes["truncate_prompt_tokens"] = truncate_prompt_tokens
    return dataclasses.replace(params, **changes)
