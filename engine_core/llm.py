"""LLM: offline batch generation over LLMEngine, with a progress bar (vLLM's `LLM.generate`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from engine_core.config import EngineArgs
from engine_core.llm_engine import LLMEngine, PromptType
from engine_core.lora.request import LoRARequest
from engine_core.outputs import EmbeddingRequestOutput, PoolingRequestOutput, RequestOutput
from engine_core.pooling.params import PoolingParams
from engine_core.sampling_params import RequestOutputKind, SamplingParams


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
            prompts, pooling_params, truncate_prompt_tokens, use_tqdm, lora_request)]

    def encode(self, prompts: PromptType | Sequence[PromptType],
               pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
               truncate_prompt_tokens: int | None = None, use_tqdm: bool = True,
               lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
               pooling_task: str = "embed") -> list[PoolingRequestOutput]:
        """vLLM's LLM.encode: each prompt's PoolingRequestOutput (outputs.data, a tensor).
        pooling_task: "embed", the one task a decoder model's pooler does here."""
        if pooling_task != "embed":
            raise ValueError(f"pooling_task must be 'embed' (the pooler of a decoder model "
                             f"embeds), got {pooling_task!r}")
        if self.engine.args.runner != "pooling":
            raise ValueError("LLM.embed() and LLM.encode() need runner='pooling' (vLLM's "
                             f"--runner pooling): this engine's runner is "
                             f"{self.engine.args.runner!r}")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            params_list = [pooling_params or PoolingParams()] * len(prompts)
        elif len(pooling_params) != len(prompts):
            raise ValueError(f"pooling_params must be one or one per prompt ({len(prompts)}), "
                             f"got {len(pooling_params)}")
        else:
            params_list = list(pooling_params)
        if truncate_prompt_tokens is not None:
            params_list = [dataclasses.replace(p, truncate_prompt_tokens=truncate_prompt_tokens)
                           for p in params_list]
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
