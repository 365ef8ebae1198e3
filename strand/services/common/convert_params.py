"""pb <-> dataclass for what a client sends: SamplingParams and prompts.

pb -> dataclass goes through SamplingParams' own validation, so a bad value raises ValueError naming
the field; services map that to INVALID_ARGUMENT before anything changes.
"""

from __future__ import annotations

import json
from typing import Any

from strand.engine_core.processing.input_processor import PROMPT_KEYS
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.engine_core.structured_output.params import StructuredOutputsParams
from strand.services._proto.strand.v1 import types_pb2 as pb

PromptType = str | dict[str, Any]

# Optional scalar fields copied as they are when set (unset: the dataclass default).
_OPTIONAL_SCALARS = (
    "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "min_tokens", "logprobs", "prompt_logprobs",
    "skip_special_tokens", "spaces_between_special_tokens", "detokenize",
    "truncate_prompt_tokens",
)


def params_to_pb(params: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        include_stop_str_in_output=params.include_stop_str_in_output,
        ignore_eos=params.ignore_eos,
        output_kind=int(params.output_kind),  # type: ignore[arg-type]
    )
    for name in _OPTIONAL_SCALARS:
        value = getattr(params, name)
        if value is not None:
            setattr(msg, name, value)
    if params.max_tokens is None:
        msg.max_tokens_unlimited = True
    else:
        msg.max_tokens = params.max_tokens
    if params.logit_bias:
        for token_id, bias in params.logit_bias.items():
            msg.logit_bias[int(token_id)] = float(bias)
    if params.allowed_token_ids is not None:
        msg.allowed_token_ids.extend(params.allowed_token_ids)
    if params.bad_words:
        msg.bad_words.extend(params.bad_words)
    for ids in params.bad_words_token_ids or ():
        msg.bad_words_token_ids.add().ids.extend(ids)
    if params.extra_args is not None:
        msg.extra_args_json = json.dumps(params.extra_args)
    if params.structured_outputs is not None:
        msg.structured_outputs.CopyFrom(structured_to_pb(params.structured_outputs))
    return msg


def structured_to_pb(so: StructuredOutputsParams) -> pb.StructuredOutputsParams:
    msg = pb.StructuredOutputsParams(disable_any_whitespace=so.disable_any_whitespace)
    if so.reasoning_end is not None:
        msg.reasoning_end = so.reasoning_end
    kind = so.kind
    if kind == "json":
        msg.json = so.json if isinstance(so.json, str) else json.dumps(so.json)
    elif kind == "choice":
        msg.choice.choices.extend(so.choice or [])
    elif kind == "json_object":
        msg.json_object = True
    else:
        setattr(msg, kind, getattr(so, kind))
    return msg


def structured_from_pb(msg: pb.StructuredOutputsParams) -> StructuredOutputsParams:
    """ValueError naming structured_outputs when no kind (or json_object=false) is set."""
    kind = msg.WhichOneof("kind")
    kwargs: dict[str, Any] = {"disable_any_whitespace": msg.disable_any_whitespace}
    if msg.HasField("reasoning_end"):
        kwargs["reasoning_end"] = msg.reasoning_end
    if kind == "choice":
        kwargs["choice"] = list(msg.choice.choices)
    elif kind is not None:
        kwargs[kind] = getattr(msg, kind)
    return StructuredOutputsParams(**kwargs)


def params_from_pb(msg: pb.SamplingParams, validated: bool = False) -> SamplingParams:
    """ValueError naming the field when a value is out of bounds. validated=True: the message
    comes from a stage that already validated it (the tokenizer; stages authenticate each
    other), so it is rebuilt as data without checking every bound again."""
    kwargs: dict[str, Any] = {}
    for name in _OPTIONAL_SCALARS:
        if msg.HasField(name):
            kwargs[name] = getattr(msg, name)
    if msg.max_tokens_unlimited:
        kwargs["max_tokens"] = None
    elif msg.HasField("max_tokens"):
        kwargs["max_tokens"] = msg.max_tokens
    if msg.output_kind not in tuple(RequestOutputKind):
        raise ValueError(f"output_kind must be 0, 1 or 2, got {msg.output_kind}")
    kwargs.update(
        stop=list(msg.stop),
        stop_token_ids=list(msg.stop_token_ids),
        include_stop_str_in_output=msg.include_stop_str_in_output,
        ignore_eos=msg.ignore_eos,
        logit_bias=dict(msg.logit_bias) or None,
        allowed_token_ids=list(msg.allowed_token_ids) or None,
        output_kind=RequestOutputKind(msg.output_kind),
        bad_words=list(msg.bad_words) or None,
        bad_words_token_ids=[list(t.ids) for t in msg.bad_words_token_ids] or None,
    )
    if msg.HasField("extra_args_json"):
        try:
            kwargs["extra_args"] = json.loads(msg.extra_args_json)
        except ValueError as exc:
            raise ValueError(f"extra_args_json must be a JSON object: {exc}") from None
    if msg.HasField("structured_outputs"):
        kwargs["structured_outputs"] = structured_from_pb(msg.structured_outputs)
    if validated:
        return SamplingParams.from_validated(**kwargs)
    return SamplingParams(**kwargs)


def _chat_message_to_pb(m: dict[str, Any]) -> pb.ChatMessage:
    msg = pb.ChatMessage(role=m["role"], content=m["content"])
    if m.get("tool_calls"):
        msg.tool_calls_json = json.dumps(m["tool_calls"])
    if m.get("tool_call_id") is not None:
        msg.tool_call_id = m["tool_call_id"]
    if m.get("name") is not None:
        msg.name = m["name"]
    reasoning = m.get("reasoning") or m.get("reasoning_content")
    if reasoning:
        msg.reasoning = reasoning
    return msg


def _chat_message_from_pb(msg: pb.ChatMessage, i: int) -> dict[str, Any]:
    """A message as the template reads it: the fields OpenAI's message had, no empty ones."""
    m: dict[str, Any] = {"role": msg.role, "content": msg.content}
    if msg.tool_calls_json:
        try:
            m["tool_calls"] = json.loads(msg.tool_calls_json)
        except ValueError as exc:
            raise ValueError(f"messages[{i}].tool_calls must be JSON: {exc}") from None
    if msg.tool_call_id:
        m["tool_call_id"] = msg.tool_call_id
    if msg.name:
        m["name"] = msg.name
    if msg.reasoning:
        m["reasoning"] = msg.reasoning
    return m


def prompt_to_pb(prompt: PromptType) -> pb.Prompt:
    """str | {"prompt": str[, "text_pair": str]} | {"prompt_token_ids": [...]} |
    {"messages": [...]}, + cache_salt."""
    if isinstance(prompt, str):
        return pb.Prompt(text=prompt)
    if not isinstance(prompt, dict):
        raise ValueError(f"prompt must be a str or a dict, got {type(prompt).__name__}")
    unknown = sorted(set(prompt) - PROMPT_KEYS)
    if unknown:  # refused as in process, not dropped on the way
        raise ValueError(f"prompt has unknown keys {unknown}; allowed: {sorted(PROMPT_KEYS)}")
    msg = pb.Prompt()
    if "prompt_token_ids" in prompt:
        msg.token_ids.ids.extend(int(t) for t in prompt["prompt_token_ids"])
        if prompt.get("prompt") is not None:
            msg.token_ids_text = prompt["prompt"]
    elif "messages" in prompt:
        msg.chat.messages.extend(_chat_message_to_pb(m) for m in prompt["messages"])
        if "add_generation_prompt" in prompt:
            msg.chat.add_generation_prompt = bool(prompt["add_generation_prompt"])
        if prompt.get("tools") is not None:
            msg.chat.tools_json = json.dumps(prompt["tools"])
        if prompt.get("chat_template_kwargs") is not None:
            msg.chat.template_kwargs_json = json.dumps(prompt["chat_template_kwargs"])
        if prompt.get("continue_final_message"):
            msg.chat.continue_final_message = True
    elif "prompt" in prompt:
        msg.text = prompt["prompt"]
        if prompt.get("text_pair") is not None:
            msg.text_pair = prompt["text_pair"]
    else:
        raise ValueError("prompt must have one of the keys 'prompt', 'prompt_token_ids', "
                         f"'messages', got {sorted(prompt)}")
    if prompt.get("cache_salt") is not None:
        msg.cache_salt = prompt["cache_salt"]
    return msg


def prompt_from_pb(msg: pb.Prompt) -> PromptType:
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise ValueError("prompt must be set (text, token_ids or chat)")
    result: dict[str, Any]
    if kind == "text":
        if not (msg.HasField("cache_salt") or msg.HasField("text_pair")):
            return msg.text
        result = {"prompt": msg.text}
        if msg.HasField("text_pair"):
            result["text_pair"] = msg.text_pair
    elif kind == "token_ids":
        result = {"prompt_token_ids": list(msg.token_ids.ids)}
        if msg.HasField("token_ids_text"):
            result["prompt"] = msg.token_ids_text
    else:
        result = {"messages": [_chat_message_from_pb(m, i)
                               for i, m in enumerate(msg.chat.messages)]}
        if msg.chat.HasField("add_generation_prompt"):
            result["add_generation_prompt"] = msg.chat.add_generation_prompt
        if msg.chat.tools_json:
            try:
                result["tools"] = json.loads(msg.chat.tools_json)
            except ValueError as exc:
                raise ValueError(f"tools must be JSON: {exc}") from None
        if msg.chat.template_kwargs_json:
            try:
                result["chat_template_kwargs"] = json.loads(msg.chat.template_kwargs_json)
            except ValueError as exc:
                raise ValueError(f"chat_template_kwargs must be JSON: {exc}") from None
        if msg.chat.continue_final_message:
            result["continue_final_message"] = True
    if msg.HasField("cache_salt"):
        result["cache_salt"] = msg.cache_salt
    return result
