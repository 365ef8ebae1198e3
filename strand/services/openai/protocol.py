"""The request bodies of /v1/completions and /v1/chat/completions (OpenAI's fields plus vLLM's
extra sampling fields). Unknown fields are ignored with a warning naming them, as vLLM does."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage on every chunk (with include_usage)


class _Sampling(BaseModel):
    # Unknown fields are kept aside (model_extra), so the front can log them as ignored.
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = 1
    temperature: float | None = None  # None: OpenAI's default, 1
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's extra sampling fields
    top_k: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    cache_salt: str | None = None  # the prefix cache is shared only among requests with it
    priority: int = 0  # vLLM's: lower runs first under --scheduling-policy priority
    prompt_logprobs: int | None = None  # each prompt token's, in the (non-streamed) response
    # Output constraints (strand/services/openai/structured.py): vLLM's object, its older guided_*
    # fields, and OpenAI's response_format.
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None  # refused when set (params.py): not dropped unseen


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]]
    max_tokens: int | None = None  # None: up to the model's length
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    # vLLM's: more variables for the chat template (Qwen 3's enable_thinking, ...).
    chat_template_kwargs: dict[str, Any] | None = None
    include_reasoning: bool = True  # vLLM's: false leaves a reasoning parser's part out
    # OpenAI's: given to the template as the variable `reasoning_effort` (gpt-oss, Cohere,
    # DeepSeek V4 templates read it), unless chat_template_kwargs sets it.
    reasoning_effort: str | None = None
    # vLLM's: the reply continues the last message (a prefilled assistant turn); needs
    # add_generation_prompt false.
    continue_final_message: bool = False
    # vLLM's: the reply starts with the last message's text when that message is the
    # assistant's (a reply the client began: continue_final_message).
    echo: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True  # false: at most one call a choice (vLLM's filter)
    # Refused when used (tools.py) rather than dropped: the older API.
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None


class TokenizeRequest(BaseModel):
    """/tokenize (vLLM's): a text `prompt` or chat `messages`, exactly one."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True  # chat only
    tools: list[dict[str, Any]] | None = None  # chat only: rendered by the template
    chat_template_kwargs: dict[str, Any] | None = None  # chat only: more template variables
    continue_final_message: bool = False  # chat only: the text ends inside the last message
    add_special_tokens: bool | None = None  # None: true for a prompt, false for messages
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]
