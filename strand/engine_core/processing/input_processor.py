"""InputProcessor: prompt + SamplingParams -> a validated EngineCoreRequest (the tokenizer stage)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strand.engine_core.chat_config import check_template_kwargs, think_tags
from strand.engine_core.core.engine_io import EngineCoreRequest
from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.pooling.params import PoolingParams, check_runner_fits
from strand.engine_core.processing.chat_kwargs import REASONING_KEYS, with_reasoning_keys
from strand.engine_core.processing.reasoning import prompt_ends_reasoning
from strand.engine_core.processing.request_limits import (
    RequestLimits,
    check_params,
    check_prompt_size,
    check_text_size,
)
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import MAX_LOGPROBS, SamplingParams

PROMPT_KEYS = {"prompt", "prompt_token_ids", "messages", "cache_salt", "add_generation_prompt",
               "tools", "chat_template_kwargs", "continue_final_message",
               # with "prompt": a text pair, joined by the tokenizer's pair template
               "text_pair"}


# Enough of a token-id prompt's end to hold a closing tag and the whitespace after it.
_TAIL_TOKENS = 32


@dataclass(slots=True)
class ProcessedPrompt:
    request: EngineCoreRequest  # the parent request; n > 1 fans out in the OutputProcessor
    prompt: str | None  # the prompt text (None for token-id prompts)


class InputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer | None,
        max_model_len: int,
        vocab_size: int,
        eos_token_id: int | None = None,
        max_logprobs: int = MAX_LOGPROBS,
        logits_processor_classes: Sequence[type] = (),
        limits: RequestLimits | None = None,
        reasoning_parser: str | None = None,
        default_template_kwargs: dict[str, Any] | None = None,
        priority_scheduling: bool = False,
        runner: str = "generate",
    ) -> None:
        self.tokenizer = tokenizer  # None: skip_tokenizer_init (token-id prompts only)
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
        self.eos_token_id = eos_token_id
        if max_logprobs < -1:
            raise ValueError(f"max_logprobs must be >= -1 (-1: no limit), got {max_logprobs}")
        self.max_logprobs = max_logprobs
        # Custom logits processors' classes: each validates a request's extra_args up front.
        self.logits_processor_classes = tuple(logits_processor_classes)
        self.limits = limits or RequestLimits()
        # A thinking model's tags: its structured outputs bind only after the reasoning.
        self.think_tags = None if reasoning_parser is None else think_tags(reasoning_parser)
        # vLLM refuses a priority the scheduler would ignore (fcfs): not dropped unseen.
        self.priority_scheduling = priority_scheduling
        # --default-chat-template-kwargs: under every chat request's own chat_template_kwargs.
        self.default_template_kwargs = check_template_kwargs(default_template_kwargs)
        # "pooling": requests are embedded (PoolingParams), none generates.
        self.runner = runner

    def process(
        self,
        request_id: str,
        prompt: str | dict[str, Any],
        params: SamplingParams | PoolingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> ProcessedPrompt:
        """Validate and tokenize; ValueError naming the field. Holds no state, so none changes."""
        if not isinstance(request_id, str):
            raise ValueError(f"request_id must be a str, got {type(request_id).__name__}")
        if not isinstance(priority, int):
            raise ValueError(f"priority must be an int, got {priority!r}")
        if priority != 0 and not self.priority_scheduling:
            raise ValueError(f"priority {priority} needs scheduling_policy 'priority' (the "
                             "engine schedules first come, first served): send 0, or start it "
                             "with --scheduling-policy priority")
        if lora_request is not None and not isinstance(lora_request, LoRARequest):
            raise ValueError("lora_request must be a LoRARequest or None, got "
                             f"{type(lora_request).__name__}")
        pooling = self._pooling_params(params)
        params = self._validate_params(pooling.carrier() if pooling is not None else params)
        check_prompt_size(prompt, self.limits, self.max_model_len)
        text, token_ids, salt = self._tokenize(prompt)
        token_ids = self._truncate(token_ids, params.truncate_prompt_tokens)
        cache_salt = cache_salt if cache_salt is not None else salt
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ValueError(f"cache_salt must be a non-empty str, got {cache_salt!r}")
        self._validate_token_ids(token_ids)
        params = self._after_reasoning(params, text, token_ids)
        if params.max_tokens is None:
            # vLLM: without a limit the request may fill the rest of the context window.
            params = params.clone(max_tokens=max(1, self.max_model_len - len(token_ids)))
        request = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            eos_token_id=self.eos_token_id,
            arrival_time=time.time() if arrival_time is None else arrival_time,
            priority=priority,
            cache_salt=cache_salt,
            lora_request=lora_request,
            pooling_params=pooling,
        )
        return ProcessedPrompt(request=request, prompt=text)

    def _after_reasoning(self, params: SamplingParams, text: str | None,
                         token_ids: list[int]) -> SamplingParams:
        """Under a reasoning parser, structured outputs that bind only after the closing tag,
        unless the prompt closed the reasoning itself (vLLM's engine checks the prompt too)."""
        so = params.structured_outputs
        if self.think_tags is None or so is None or so.reasoning_end is not None:
            return params
        if text is None:  # token ids: their tail's text says how the prompt ends
            text = self._tokenizer_for("structured_outputs").decode(
                token_ids[-_TAIL_TOKENS:], skip_special_tokens=False)
        if prompt_ends_reasoning(text, self.think_tags):
            return params
        return params.clone(structured_outputs=dataclasses.replace(
            so, reasoning_end=self.think_tags.end))

    def tokenize(self, prompt: str | dict[str, Any],
                 add_special_tokens: bool | None = None) -> list[int]:
        """The prompt's token ids as a request would carry them (vLLM's /tokenize), without a
        request: text encoded with the tokenizer's special tokens (add_special_tokens, default
        True), chat messages rendered by the template, which writes its own (default False),
        token ids checked against the vocab. ValueError naming the field; no length limit
        (a caller compares the count with max_model_len)."""
        check_prompt_size(prompt, self.limits, self.max_model_len)
        _, token_ids, _ = self._tokenize(prompt, add_special_tokens)
        self._check_vocab(token_ids, "prompt_token_ids")
        return token_ids

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of token ids, special tokens included (vLLM's /detokenize); ValueError for an
        id outside the vocab."""
        bound = self.limits.prompt_bytes_bound(self.max_model_len)
        if len(token_ids) > bound:
            raise ValueError(f"tokens must be at most {bound} ids, got {len(token_ids)}")
        ids = [int(t) for t in token_ids]
        self._check_vocab(ids, "tokens")
        return self._tokenizer_for("detokenize").decode(ids, skip_special_tokens=False)

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        """Each id's vocabulary entry (vLLM's return_token_strs)."""
        return self._tokenizer_for("return_token_strs").convert_ids_to_tokens(list(token_ids))

    def _tokenizer_for(self, what: str) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{what} needs a tokenizer, but {NO_TOKENIZER}")
        return self.tokenizer

    def _pooling_params(self, params: object) -> PoolingParams | None:
        """An embedding request's own copy of its PoolingParams (None on a pooling runner: the
        defaults); None for a request that generates. ValueError when the kind is not what the
        engine's runner does."""
        if params is None and self.runner == "pooling":
            return PoolingParams()
        pooling = params if isinstance(params, PoolingParams) else None
        check_runner_fits(pooling, self.runner)
        # A clone re-runs the checks (the caller may have changed its object since).
        return None if pooling is None else pooling.clone()

    def _validate_params(self, params: object) -> SamplingParams:
        if params is None:
            return SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        # A clone re-runs every bound (the caller may have mutated its object since building it)
        # and keeps the caller's object out of the engine.
        # Sizes first: a huge stop list or logit_bias is refused before anything walks it.
        check_params(params, self.limits, self.max_model_len)
        params = params.clone()
        # vLLM: max_logprobs -1 lifts the cap to the vocabulary; logprobs -1 asks for all of it.
        cap = self.vocab_size if self.max_logprobs == -1 else self.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            asked = self.vocab_size if value == -1 else value
            if asked is not None and asked > cap:
                raise ValueError(
                    f"{name} must be <= max_logprobs ({self.max_logprobs}), got {value}"
                    + (f" (the whole vocabulary, {asked} tokens)" if value == -1 else "")
                )
        if self.tokenizer is None:
            _refuse_what_needs_text(params)
            params.detokenize = False  # vLLM: token ids only, text ""
        elif params.bad_words and params.bad_words_token_ids is None:
            params.bad_words_token_ids = bad_words_token_ids(self.tokenizer, params.bad_words)
        params.validate_against_vocab(self.vocab_size)
        for cls in self.logits_processor_classes:
            validate = getattr(cls, "validate_params", None)
            if validate is not None:
                validate(params)  # ValueError naming the bad extra_args entry
        if params.allowed_token_ids and params.min_tokens > 0:
            # Until min_tokens, stop ids (and EOS) are masked: an allowed set made only of them
            # would leave nothing to sample.
            masked = set(params.stop_token_ids)
            if self.eos_token_id is not None and not params.ignore_eos:
                masked.add(self.eos_token_id)
            if set(params.allowed_token_ids) <= masked:
                raise ValueError(
                    "allowed_token_ids must contain a token that is neither EOS nor a stop "
                    f"token id while min_tokens ({params.min_tokens}) > 0, got "
                    f"{params.allowed_token_ids}")
        return params

    def _tokenize(self, prompt: object, add_special_tokens: bool | None = None
                  ) -> tuple[str | None, list[int], str | None]:
        """(text, token ids, cache salt); add_special_tokens None: the default for the kind."""
        if isinstance(prompt, str):
            return prompt, self._encode_text(prompt, add_special_tokens), None
        if not isinstance(prompt, dict):
            raise ValueError(
                "prompt must be a str or a dict with 'prompt', 'prompt_token_ids' or 'messages', "
                f"got {type(prompt).__name__}"
            )
        unknown = sorted(set(prompt) - PROMPT_KEYS)
        if unknown:
            raise ValueError(f"prompt has unknown keys {unknown}; allowed: {sorted(PROMPT_KEYS)}")
        salt = prompt.get("cache_salt")
        if "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise ValueError("prompt_token_ids must be a list of ints")
            text = prompt.get("prompt")
            return (text if isinstance(text, str) else None), list(ids), salt
        if "messages" in prompt:
            messages = _check_messages(prompt["messages"])
            add_generation_prompt = bool(prompt.get("add_generation_prompt", True))
            tokenizer = self._text_tokenizer()
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt, _check_tools(prompt.get("tools")),
                {**self.default_template_kwargs,
                 **check_template_kwargs(prompt.get("chat_template_kwargs"))},
                bool(prompt.get("continue_final_message", False)))
            # What the template wrote (tools, calls' arguments, ...) is bounded too, before
            # the tokenizer spends the stage's time on it.
            check_text_size([text], self.limits.prompt_bytes_bound(self.max_model_len),
                            self.max_model_len, "prompt (the chat as its template writes it)")
            # The template writes its own bos; encoding must not add a second one.
            return text, tokenizer.encode(text, add_special_tokens=bool(add_special_tokens)), salt
        if "prompt" in prompt:
            text = prompt["prompt"]
            if not isinstance(text, str):
                raise ValueError(f"prompt must be a str, got {type(text).__name__}")
            if "text_pair" in prompt:
                return text, self._encode_pair(text, prompt["text_pair"]), salt
            return text, self._encode_text(text, add_special_tokens), salt
        raise ValueError("prompt dict needs one of 'prompt', 'prompt_token_ids' or 'messages'")

    def _truncate(self, token_ids: list[int], keep: int | None) -> list[int]:
        """vLLM's truncate_prompt_tokens: keep the last `keep` tokens (-1: max_model_len)."""
        if keep is None:
            return token_ids
        if keep == -1:
            keep = self.max_model_len
        if keep > self.max_model_len:
            raise ValueError(f"truncate_prompt_tokens ({keep}) must be <= max_model_len "
                             f"({self.max_model_len})")
        return token_ids[-keep:]

    def _encode_text(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        tokenizer = self._text_tokenizer()
        if not text:
            raise ValueError("prompt must not be empty")
        return tokenizer.encode(text, add_special_tokens=add_special_tokens is not False)

    def _encode_pair(self, text: str, pair: object) -> list[int]:
        """A cross-encoder's (query, document): one prompt, the pair template's special
        tokens included."""
        if not isinstance(pair, str) or not pair or not text:
            raise ValueError("a text pair needs two non-empty strings: prompt and text_pair, "
                             f"got {type(pair).__name__} text_pair")
        return self._text_tokenizer().encode_pair(text, pair)

    def _text_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            # vLLM's words, which its tests match.
            raise ValueError(f"You cannot pass text prompts when {NO_TOKENIZER}: pass "
                             "{'prompt_token_ids': [...]}")
        return self.tokenizer

    def _validate_token_ids(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("prompt must not be empty (prompt_token_ids has no tokens)")
        self._check_vocab(token_ids, "prompt_token_ids")
        if len(token_ids) > self.max_model_len:
            raise ValueError(
                f"prompt is {len(token_ids)} tokens, longer than max_model_len "
                f"({self.max_model_len})"
            )

    def _check_vocab(self, token_ids: list[int], field: str) -> None:
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{field} must be in [0, {self.vocab_size}) (the vocab), got {bad[:8]}")


NO_TOKENIZER = "skip_tokenizer_init is True (no tokenizer is loaded)"


def _refuse_what_needs_text(params: SamplingParams) -> None:
    """Without a tokenizer there is no text to match or constrain: refused by field name."""
    if params.stop:
        raise ValueError(f"stop strings need a tokenizer, but {NO_TOKENIZER}: "
                         "use stop_token_ids")
    if params.bad_words and params.bad_words_token_ids is None:
        raise ValueError(f"bad_words need a tokenizer, but {NO_TOKENIZER}")
    if params.structured_outputs is not None:
        raise ValueError(f"structured_outputs need a tokenizer, but {NO_TOKENIZER}")


def _check_messages(messages: object) -> list[dict[str, Any]]:
    """{'role', 'content'} dicts; an assistant's may carry 'tool_calls' (OpenAI's list of
    {"id", "type", "function": {"name", "arguments"}}), a tool's 'tool_call_id' and 'name':
    the chat template reads them."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise ValueError(f"messages[{i}] must be a dict with str 'role' and 'content'")
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(
                isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)):
            raise ValueError(f"messages[{i}].tool_calls must be a list of "
                             "{'id', 'type', 'function': {'name', 'arguments'}} dicts")
        for key in ("tool_call_id", "name", *REASONING_KEYS):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise ValueError(f"messages[{i}].{key} must be a str")
    return [with_reasoning_keys(_arguments_as_objects(m, i)) for i, m in enumerate(messages)]


def tool_call_arguments(arguments: object, where: str) -> object:
    """A tool call's arguments as templates read them: OpenAI's JSON string parsed into its
    object (empty: {}), as vLLM hands them over; ValueError naming `where` for text that is no
    JSON object."""
    if not isinstance(arguments, str):
        return {} if arguments is None else arguments
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"{where}.function.arguments must be a JSON object")
    return value


def _arguments_as_objects(message: dict[str, Any], i: int) -> dict[str, Any]:
    """The message with each tool call's arguments an object (a template writes
    `arguments | tojson`); a copy where changed."""
    calls = message.get("tool_calls")
    if not calls or all(not isinstance(c["function"].get("arguments"), str) for c in calls):
        return message
    parsed = [{**call, "function": {**call["function"], "arguments": tool_call_arguments(
        call["function"].get("arguments"), f"messages[{i}].tool_calls[{j}]")}}
        for j, call in enumerate(calls)]
    return {**message, "tool_calls": parsed}


def _check_tools(tools: object) -> list[dict[str, Any]] | None:
    """The template's `tools` (OpenAI's function specs), as given: a list of dicts or None."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("tools must be a list of dicts (OpenAI's tool specs)")
    return tools


def bad_words_token_ids(tokenizer: Tokenizer, bad_words: list[str]) -> list[list[int]]:
    """Token ids of each bad word, alone and after a space (a word mid-text usually starts with
    one), as vLLM tokenizes them; the spaced form only when it is a different word token of
    the same length."""
    result: list[list[int]] = []
    for word in bad_words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if plain:
            result.append(plain)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced and plain and spaced[0] != plain[0] and len(spaced) == len(plain):
            result.append(spaced)
    return result
