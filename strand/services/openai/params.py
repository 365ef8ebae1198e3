"""OpenAI request -> the engine's prompts and SamplingParams."""

from __future__ import annotations

from typing import Any

from strand.engine_core.processing.chat_kwargs import REASONING_KEYS
from strand.engine_core.processing.input_processor import tool_call_arguments
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.engine_core.structured_output.params import StructuredOutputsParams
from strand.services.common.convert import PromptType
from strand.services.openai.errors import bad_request
from strand.services.openai.protocol import ChatCompletionRequest, CompletionRequest, _Sampling
from strand.services.openai.structured import structured_outputs_of
from strand.services.openai.tool_parser import AutoTools
from strand.services.openai.tools import ToolChoice


def completion_prompts(req: CompletionRequest) -> list[PromptType]:
    """One engine prompt per OpenAI prompt: a str, a list of str, token ids or lists of them."""
    return prompts_of(req.prompt, "prompt")


def prompts_of(prompt: str | list[str] | list[int] | list[list[int]],
               field: str) -> list[PromptType]:
    """OpenAI's prompt forms (completions' `prompt`, embeddings' `input`) as engine prompts."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request(f"{field} must not be empty", field)
    if all(isinstance(p, int) for p in prompt):
        return [{"prompt_token_ids": list(prompt)}]  # type: ignore[arg-type]
    return [p if isinstance(p, str) else {"prompt_token_ids": list(p)}  # type: ignore[arg-type]
            for p in prompt]


def salted(prompts: list[PromptType], cache_salt: str | None) -> list[PromptType]:
    """The prompts with the request's cache_salt (vLLM's field), which the engine checks."""
    if cache_salt is None:
        return prompts
    return [{"prompt": p, "cache_salt": cache_salt} if isinstance(p, str)
            else {**p, "cache_salt": cache_salt} for p in prompts]


def chat_echo(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the last message's text, where it is the assistant's (the reply's
    role), for each choice to begin with; "" otherwise."""
    if not (req.echo and req.messages and req.messages[-1].get("role") == "assistant"):
        return ""
    return _text_content(req.messages[-1].get("content"), len(req.messages) - 1)


def template_kwargs_of(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The request's chat_template_kwargs, with OpenAI's reasoning_effort as a variable."""
    if req.reasoning_effort is None:
        return req.chat_template_kwargs
    return {"reasoning_effort": req.reasoning_effort, **(req.chat_template_kwargs or {})}


def chat_prompt(messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None = None,
                template_kwargs: dict[str, Any] | None = None,
                continue_final_message: bool = False) -> PromptType:
    """The engine renders the model's chat template from {"messages": [...]} (and the tools,
    for a template that lists them, and vLLM's chat_template_kwargs, which the tokenizer
    stage checks)."""
    texts = [_message(m, i) for i, m in enumerate(messages)]
    prompt: dict[str, Any] = {"messages": texts, "add_generation_prompt": add_generation_prompt}
    if tools:
        prompt["tools"] = tools
    if template_kwargs is not None:
        prompt["chat_template_kwargs"] = template_kwargs
    if continue_final_message:
        prompt["continue_final_message"] = True
    return prompt


def _message(m: dict[str, Any], index: int) -> dict[str, Any]:
    """A message as the template reads it: role and text; an assistant's tool calls, each
    call's arguments as an object (vLLM parses OpenAI's JSON string so, for the templates that
    write them out); a tool message's tool_call_id and name."""
    out: dict[str, Any] = {"role": str(m.get("role", "")),
                           "content": _text_content(m.get("content"), index)}
    calls = m.get("tool_calls")
    if calls:
        out["tool_calls"] = [_tool_call(c, index, j) for j, c in enumerate(
            calls if isinstance(calls, list) else [calls])]
    for key in ("tool_call_id", "name", *REASONING_KEYS):
        if m.get(key) is not None:
            if not isinstance(m[key], str):
                raise bad_request(f"messages[{index}].{key} must be a string", "messages")
            out[key] = m[key]
    return out


def _tool_call(call: Any, index: int, j: int) -> dict[str, Any]:
    where = f"messages[{index}].tool_calls[{j}]"
    function = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(function, dict) and isinstance(function.get("name"), str)):
        raise bad_request(f'{where} must be {{"id": ..., "type": "function", "function": '
                          '{"name": ..., "arguments": "<JSON>"}}', "messages")
    try:
        arguments = tool_call_arguments(function.get("arguments"), where)
    except ValueError as exc:
        raise bad_request(str(exc), "messages") from None
    return {"id": str(call.get("id", "")), "type": "function",
            "function": {"name": function["name"], "arguments": arguments}}


def _text_content(content: Any, index: int) -> str:
    # OpenAI allows a list of parts; only text parts have a meaning for a text model.
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise bad_request(f"messages[{index}].content: only text parts are supported",
                                  "messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad_request(f"messages[{index}].content must be a str or a list of text parts",
                      "messages")


def completion_params(req: CompletionRequest) -> SamplingParams:
    """With echo, the prompt's logprobs are asked for too; max_tokens 0 with echo samples one
    token that is not shown (strand/services/openai/echo.py)."""
    if req.suffix is not None:
        raise bad_request("suffix is not supported", "suffix")
    max_tokens = 1 if echo_only(req) else req.max_tokens
    params = _params(req, max_tokens, req.logprobs)
    if req.echo and req.logprobs is not None:
        params = params.clone(prompt_logprobs=max(req.logprobs, req.prompt_logprobs or 0))
    return params


def echo_only(req: CompletionRequest) -> bool:
    return req.echo and req.max_tokens == 0


def chat_params(req: ChatCompletionRequest, tool: ToolChoice | None = None) -> SamplingParams:
    """tool: how the reply makes tool calls (tools.py); a named function's or "required"'s
    schema constrains it, "auto" nothing."""
    if req.continue_final_message and req.add_generation_prompt:
        raise bad_request("continue_final_message needs add_generation_prompt false (the one "
                          "continues the last message, the other opens a new one)",
                          "continue_final_message")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    max_tokens = req.max_completion_tokens or req.max_tokens
    structured = (None if tool is None or tool.schema is None
                  else StructuredOutputsParams(json=tool.schema))
    params = _params(req, max_tokens, logprobs, structured)
    if isinstance(tool, AutoTools) and tool.parser == "mistral":
        # Its calls follow the [TOOL_CALLS] control token, which the reply must keep (vLLM's
        # mistral parser asks the same of every request that sends tools).
        params.skip_special_tokens = False
    return params


def _params(req: _Sampling, max_tokens: int | None, logprobs: int | None,
            structured: StructuredOutputsParams | None = None) -> SamplingParams:
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    try:
        logit_bias = ({int(k): float(v) for k, v in req.logit_bias.items()}
                      if req.logit_bias else None)
    except ValueError:
        raise bad_request("logit_bias keys must be token ids", "logit_bias") from None
    kind = RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY
    if req.prompt_logprobs is not None and req.stream:
        raise bad_request("prompt_logprobs are not available when stream is enabled",
                          "prompt_logprobs")
    structured = structured or structured_outputs_of(req)
    try:
        return SamplingParams(
            n=req.n, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if req.top_k is None else req.top_k, min_p=req.min_p,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty, seed=req.seed, max_tokens=max_tokens,
            min_tokens=req.min_tokens, stop=stop, stop_token_ids=list(req.stop_token_ids or []),
            include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos, logprobs=logprobs, logit_bias=logit_bias,
            skip_special_tokens=req.skip_special_tokens,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            allowed_token_ids=req.allowed_token_ids, bad_words=req.bad_words,
            truncate_prompt_tokens=req.truncate_prompt_tokens, output_kind=kind,
            prompt_logprobs=req.prompt_logprobs,
            structured_outputs=structured)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
