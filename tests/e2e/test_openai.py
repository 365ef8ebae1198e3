"""The OpenAI-compatible front (`strand serve --openai-port`), driven by the official `openai` SDK
against a real stack: completions and chat, streamed and not, n > 1, stop, logprobs, errors in
OpenAI's shape, /v1/models, and a dropped stream aborting its request in the engine.

The model has random weights: the tests assert on structure, counts, finish reasons and usage,
and compare runs of greedy decoding with each other, never on what the text says."""

from __future__ import annotations

import http.client
import importlib.metadata
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from strand.services.client import EngineClient
from strand.services.launch import REPO_ROOT, Stack, StackConfig, free_port, launch_stack
from tests.conftest import build_tiny_model
from tests.e2e.conftest import ENGINE_FLAGS, engine_num_unfinished
from tests.e2e.otlp_receiver import OtlpReceiver

# Long enough that a request of this many tokens cannot finish while the cancel test waits.
LONG_MAX_TOKENS = 16000
CHAT = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def openai_stack(tmp_path_factory: pytest.TempPathFactory,
                 otlp_receiver: OtlpReceiver) -> Iterator[Stack]:
    model = build_tiny_model(tmp_path_factory.mktemp("tiny-long"),
                             max_position_embeddings=LONG_MAX_TOKENS + 64)
    config = StackConfig(model=str(model), engine_args=list(ENGINE_FLAGS),
                         gateway_args=["--auto-step"],
                         log_dir=tmp_path_factory.mktemp("openai-stack-logs"), openai_port=0,
                         otlp_traces_endpoint=otlp_receiver.endpoint,
                         openai_args=["--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                      "--enable-prompt-tokens-details"])
    with launch_stack(config, timeout=120) as stack:
        yield stack


@pytest.fixture(scope="module")
def model_name(openai_stack: Stack) -> str:
    return openai_stack.config.model  # the gateway's model: the front's default name


@pytest.fixture
def client(openai_stack: Stack) -> Iterator[openai.OpenAI]:
    base = f"http://{openai_stack.address('openai')}/v1"
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as c:
        yield c
    # The stack is shared: no test may leave a request running for the next one.
    assert _wait_idle(openai_stack)


def _wait_idle(stack: Stack, seconds: float = 30.0) -> bool:
    """The engine itself holds nothing (the front's requests are the front's own client's:
    a gateway client of the test's would not see them)."""
    for _ in range(int(seconds / 0.1)):
        if engine_num_unfinished(stack) == 0:
            return True
        time.sleep(0.1)
    return False


def test_completion_counts_usage_and_finishes_by_length(client: openai.OpenAI,
                                                       model_name: str) -> None:
    resp = client.completions.create(model=model_name, prompt=[1, 42, 7], max_tokens=5,
                                     temperature=0.0, extra_body={"ignore_eos": True})
    assert resp.id.startswith("cmpl-") and resp.object == "text_completion"
    assert resp.model == model_name and resp.created > 0
    assert [c.index for c in resp.choices] == [0]
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens,
            resp.usage.total_tokens) == (3, 5, 8)


def test_n2_and_a_list_of_prompts_give_one_choice_each(client: openai.OpenAI,
                                                      model_name: str) -> None:
    resp = client.completions.create(model=model_name, prompt=["Hello", "A robot"], n=2,
                                     max_tokens=3, seed=1, extra_body={"ignore_eos": True})
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert {c.finish_reason for c in resp.choices} == {"length"}
    assert resp.usage is not None and resp.usage.completion_tokens == 4 * 3


def test_seed_repeats_the_sample(client: openai.OpenAI, model_name: str) -> None:
    texts = [client.completions.create(model=model_name, prompt="Hello", max_tokens=8,
                                       temperature=1.0, seed=7).choices[0].text
             for _ in range(2)]
    assert texts[0] == texts[1]


def test_stop_string_ends_the_text_before_it(client: openai.OpenAI, model_name: str) -> None:
    kwargs = {"model": model_name, "prompt": "A robot may not", "max_tokens": 12,
              "temperature": 0.0, "extra_body": {"ignore_eos": True}}
    full = client.completions.create(**kwargs).choices[0].text  # type: ignore[call-overload]
    # A stop string from the middle of the greedy text: the same run must end right before it.
    stop = next(ch for ch in full[len(full) // 2:] if ch.isalnum())
    resp = client.completions.create(stop=[stop], **kwargs)  # type: ignore[call-overload]
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].text == full[:full.index(stop)]


def test_completion_logprobs_per_token(client: openai.OpenAI, model_name: str) -> None:
    resp = client.completions.create(model=model_name, prompt="Hello", max_tokens=4,
                                     logprobs=2, extra_body={"ignore_eos": True})
    lp = resp.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(x <= 0.0 for x in lp.token_logprobs)
    assert all(2 <= len(top) <= 3 for top in lp.top_logprobs)  # top 2, plus the sampled one
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_streamed_completion_equals_the_whole_one(client: openai.OpenAI,
                                                 model_name: str) -> None:
    kwargs = {"model": model_name, "prompt": "Hello", "max_tokens": 6, "temperature": 0.0,
              "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**kwargs)  # type: ignore[call-overload]
    chunks = list(client.completions.create(  # type: ignore[call-overload]
        stream=True, stream_options={"include_usage": True}, **kwargs))
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].id.startswith("cmpl-")
    text = "".join(ch.text for c in chunks for ch in c.choices)
    assert text == whole.choices[0].text
    reasons = [ch.finish_reason for c in chunks for ch in c.choices]
    assert reasons[-1] == "length" and set(reasons[:-1]) <= {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])


def test_echo_puts_the_prompt_and_its_logprobs_first(client: openai.OpenAI,
                                                     model_name: str) -> None:
    greedy = {"model": model_name, "prompt": "kalo mi sona", "temperature": 0.0, "logprobs": 1,
              "extra_body": {"ignore_eos": True}}
    plain = client.completions.create(max_tokens=3, **greedy).choices[0]  # type: ignore[call-overload]
    echoed = client.completions.create(max_tokens=3, echo=True, **greedy)  # type: ignore[call-overload]
    scored = client.completions.create(max_tokens=0, echo=True, **greedy)  # type: ignore[call-overload]
    assert echoed.usage is not None and scored.usage is not None
    num_prompt = echoed.usage.prompt_tokens
    assert echoed.choices[0].text == "kalo mi sona" + plain.text
    assert scored.choices[0].text == "kalo mi sona"  # max_tokens 0: the prompt alone
    lp, prompt_lp = echoed.choices[0].logprobs, scored.choices[0].logprobs
    assert lp is not None and prompt_lp is not None and plain.logprobs is not None
    assert lp.token_logprobs is not None and prompt_lp.token_logprobs is not None
    assert len(lp.token_logprobs) == num_prompt + 3
    assert prompt_lp.token_logprobs == lp.token_logprobs[:num_prompt]
    assert prompt_lp.token_logprobs[0] is None and prompt_lp.top_logprobs[0] is None  # type: ignore[index]
    assert all(x is not None and x <= 0.0 for x in prompt_lp.token_logprobs[1:])
    # The same tokens' logprobs; computed beside the prompt's they may differ in the last bit.
    assert lp.token_logprobs[num_prompt:] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-5)
    assert lp.text_offset == sorted(lp.text_offset)  # type: ignore[arg-type]
    assert lp.tokens is not None and "".join(lp.tokens[1:]).endswith(echoed.choices[0].text[-3:])
    streamed = list(client.completions.create(max_tokens=3, echo=True, stream=True, **greedy))  # type: ignore[call-overload]
    assert streamed[0].choices[0].text.startswith("kalo mi sona")
    assert "".join(ch.text for c in streamed for ch in c.choices) == echoed.choices[0].text


def test_prompt_logprobs_score_each_prompt_token(client: openai.OpenAI,
                                                model_name: str) -> None:
    greedy = {"model": model_name, "prompt": "kalo mi sona", "temperature": 0.0,
              "max_tokens": 0, "echo": True, "logprobs": 1}
    echoed = client.completions.create(**greedy).choices[0].logprobs  # type: ignore[call-overload]
    resp = client.completions.create(model=model_name, prompt="kalo mi sona", max_tokens=1,
                                     extra_body={"prompt_logprobs": 1})
    rows = resp.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
    assert echoed is not None and rows[0] is None and len(rows) == resp.usage.prompt_tokens  # type: ignore[union-attr]
    # Each row holds the prompt token (its logprob the echo's) and the top one (rank 1).
    assert all(1 <= len(row) <= 2 and any(e["rank"] == 1 for e in row.values())
               for row in rows[1:])
    scored = [max((e["logprob"] for e in row.values() if e["decoded_token"] == token),
                  default=None) for row, token in zip(rows[1:], echoed.tokens[1:], strict=True)]  # type: ignore[index, arg-type]
    assert scored == pytest.approx(echoed.token_logprobs[1:], abs=1e-5)  # type: ignore[index]
    chat = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=1,  # type: ignore[arg-type]
                                          extra_body={"prompt_logprobs": 0})
    assert len(chat.model_extra["prompt_logprobs"]) == chat.usage.prompt_tokens  # type: ignore[index, union-attr]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt="Hi", max_tokens=1, stream=True,
                                  extra_body={"prompt_logprobs": 1})
    assert info.value.response.json()["error"]["param"] == "prompt_logprobs"


def test_echo_of_token_ids_is_their_text(client: openai.OpenAI, model_name: str,
                                         openai_stack: Stack) -> None:
    with EngineClient(openai_stack.gateway_address, timeout=60) as engine:
        ids = engine.tokenize("kalo mi")["tokens"]
        text = engine.detokenize(ids)
    resp = client.completions.create(model=model_name, prompt=ids, max_tokens=0, echo=True)
    assert resp.choices[0].text == text


def test_max_tokens_zero_needs_echo(client: openai.OpenAI, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt="Hi", max_tokens=0)
    assert info.value.response.json()["error"]["param"] == "max_tokens"


def test_vllms_extra_fields_reach_the_engine(client: openai.OpenAI, model_name: str,
                                             openai_stack: Stack) -> None:
    only = client.completions.create(model=model_name, prompt="Hi", max_tokens=3,
                                     extra_body={"allowed_token_ids": [40], "ignore_eos": True})
    with EngineClient(openai_stack.gateway_address, timeout=60) as engine:
        assert only.choices[0].text == engine.detokenize([40, 40, 40])
    cut = client.completions.create(model=model_name, prompt="kalo mi sona pona", max_tokens=1,
                                    extra_body={"truncate_prompt_tokens": 2, "cache_salt": "s"})
    assert cut.usage is not None and cut.usage.prompt_tokens == 2
    # Refused by the engine's own checks, naming the field: so they were passed on.
    for extra, param in (({"cache_salt": ""}, "cache_salt"), ({"bad_words": [" "]}, "bad_words")):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=model_name, prompt="Hi", max_tokens=1,
                                      extra_body=extra)
        assert info.value.response.json()["error"]["param"] == param


TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
    "additionalProperties": False}}}


@pytest.mark.parametrize(("extra", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),  # "required" needs tools
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {}}], "tool_choice": "none"}, "tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}},
      "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"continue_final_message": True}, "continue_final_message"),
    ({"priority": 1}, "priority"),  # vLLM's: this stack schedules fcfs, so it would be ignored
])
def test_chat_fields_it_cannot_honour_are_refused(client: openai.OpenAI, model_name: str,
                                                 extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=1,  # type: ignore[arg-type]
                                       extra_body=extra)
    assert info.value.response.json()["error"]["param"] == param


def test_unknown_fields_are_served_without_and_named_in_the_log(client: openai.OpenAI,
                                                               model_name: str,
                                                               openai_stack: Stack) -> None:
    resp = client.completions.create(model=model_name, prompt="Hi", max_tokens=1,
                                     extra_body={"frobnicate": 1, "zeal": "x"})
    assert resp.choices[0].finish_reason == "length"
    assert openai_stack.config.log_dir is not None
    log = openai_stack.config.log_dir / "openai.log"
    for _ in range(50):  # the front's stderr reaches the file on its own schedule
        if "['frobnicate', 'zeal'] are not known and were ignored" in log.read_text():
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"no warning in {log}")


def test_a_named_tool_choice_answers_with_a_call_to_it(client: openai.OpenAI,
                                                      model_name: str) -> None:
    named = {"type": "function", "function": {"name": "f"}}
    resp = client.chat.completions.create(  # type: ignore[call-overload]
        model=model_name, messages=CHAT, tools=[TOOL], tool_choice=named, max_tokens=40,
        temperature=0.0)
    message = resp.choices[0].message
    assert message.content == "" and message.tool_calls is not None
    [call] = message.tool_calls
    assert call.type == "function" and call.function.name == "f"  # type: ignore[union-attr]
    assert call.id.startswith("chatcmpl-tool-")
    arguments = call.function.arguments  # type: ignore[union-attr]
    assert arguments.lstrip().startswith("{")  # the schema holds from the first token
    if resp.choices[0].finish_reason == "stop":  # random weights: it may run out of tokens
        assert set(json.loads(arguments)) == {"n"}
    chunks = list(client.chat.completions.create(  # type: ignore[call-overload]
        model=model_name, messages=CHAT, tools=[TOOL], tool_choice=named,
        max_tokens=40, temperature=0.0, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert calls[0].id and calls[0].function.name == "f"  # type: ignore[union-attr]
    assert all(c.id is None for c in calls[1:])
    assert "".join(c.function.arguments or "" for c in calls) == arguments  # type: ignore[union-attr]
    plain = client.chat.completions.create(  # type: ignore[call-overload]
        model=model_name, messages=CHAT, tools=[TOOL], tool_choice="none", max_tokens=3)
    assert plain.choices[0].message.tool_calls is None


TOOL_G = {"type": "function", "function": {"name": "g", "parameters": {
    "type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"],
    "additionalProperties": False}}}


def _whitespace_tokens(model_dir: str) -> list[int]:
    """The tiny model's tokens that are only whitespace (byte-level BPE spells a space, tab,
    newline and carriage return as these characters)."""
    vocab = json.loads((Path(model_dir) / "tokenizer.json").read_text())["model"]["vocab"]
    return [i for token, i in vocab.items() if token and set(token) <= set("\u0120\u0109\u010a\u010d")]


def test_a_required_tool_choice_answers_with_calls_to_the_tools(client: openai.OpenAI,
                                                                model_name: str) -> None:
    # vLLM's "required": the reply is held to a JSON array of {"name", "parameters"} calls.
    # The random weights would fill the JSON's optional whitespace to max_tokens: biased away.
    bias = dict.fromkeys(map(str, _whitespace_tokens(model_name)), -100)
    kwargs = {"model": model_name, "messages": CHAT, "tools": [TOOL, TOOL_G],
              "tool_choice": "required", "max_tokens": 200, "temperature": 0.0,
              "logit_bias": bias}
    resp = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    choice = resp.choices[0]
    chunks = list(client.chat.completions.create(**kwargs, stream=True))  # type: ignore[call-overload]
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls
                for c in ch.choices[0].delta.tool_calls]
    calls = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls"  # vLLM's for "required"
    assert choice.message.content == "" and calls
    keys = {"f": {"n"}, "g": {"b"}}
    for call in calls:
        assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
        assert set(json.loads(call.function.arguments)) == keys[call.function.name]  # type: ignore[union-attr]
    assert [(c.index, c.function.name, c.function.arguments) for c in streamed] == [  # type: ignore[union-attr]
        (i, c.function.name, c.function.arguments) for i, c in enumerate(calls)]  # type: ignore[union-attr]
    cut = client.chat.completions.create(**{**kwargs, "max_tokens": 3})  # type: ignore[call-overload]
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.tool_calls is None
    assert (cut.choices[0].message.content or "").startswith("[")  # held from the first token


def test_auto_tool_choice_is_parsed_and_text_stays_text(client: openai.OpenAI,
                                                         model_name: str) -> None:
    # The front runs --enable-auto-tool-choice --tool-call-parser hermes: OpenAI's default
    # "auto" is served, nothing constrains the reply, and the random weights write no
    # <tool_call> block: the reply is its text, streamed the same.
    kwargs = {"model": model_name, "messages": CHAT, "tools": [TOOL], "max_tokens": 8,
              "temperature": 0.0, "extra_body": {"ignore_eos": True}}
    resp = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    choice = resp.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    chunks = list(client.chat.completions.create(**kwargs, stream=True))  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == choice.message.content and "<tool_call>" not in streamed


def test_tool_calls_and_results_in_the_history_reach_the_template(client: openai.OpenAI,
                                                                   model_name: str,
                                                                   openai_stack: Stack) -> None:
    # OpenAI's arguments string goes to the template as an object (the tiny template writes
    # each call as "<|call|>NAME ARGUMENTS-JSON" and has a tool role).
    history = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [{
        "id": "1", "type": "function", "function": {"name": "f", "arguments": '{"n": 3}'}}]},
        {"role": "tool", "tool_call_id": "1", "content": "three"}]
    resp = client.chat.completions.create(model=model_name, messages=history, max_tokens=1)  # type: ignore[arg-type]
    assert resp.choices[0].finish_reason in ("length", "stop")
    base = f"http://{openai_stack.address('openai')}"
    _, tokenized = _post(f"{base}/tokenize", {"model": model_name, "messages": history})
    _, detokenized = _post(f"{base}/detokenize", {"model": model_name,
                                                  "tokens": tokenized["tokens"]})
    prompt = detokenized["prompt"]
    assert '<|assistant|>\n<|call|>f {"n": 3}<|end|>\n<|tool|>\nthree<|end|>' in prompt
    bad = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [{
        "id": "1", "type": "function", "function": {"name": "f", "arguments": "{n: 3"}}]}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=bad, max_tokens=1)  # type: ignore[arg-type]
    assert ("messages[1].tool_calls[0].function.arguments must be a JSON object"
            in info.value.response.json()["error"]["message"])


def test_suffix_is_refused(client: openai.OpenAI, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt="Hi", suffix="end", max_tokens=1)
    assert info.value.response.json()["error"]["param"] == "suffix"


def test_continuous_usage_stats_count_on_every_chunk(client: openai.OpenAI,
                                                     model_name: str) -> None:
    chunks = list(client.completions.create(  # type: ignore[call-overload]
        model=model_name, prompt="Hello", max_tokens=4, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True}))
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 4
    assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for c in chunks)


def test_chat_completion(client: openai.OpenAI, model_name: str) -> None:
    resp = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=5,  # type: ignore[arg-type]
                                          n=2, temperature=0.8, seed=3,
                                          extra_body={"ignore_eos": True})
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion"
    assert [c.index for c in resp.choices] == [0, 1]
    assert all(c.message.role == "assistant" and isinstance(c.message.content, str)
               for c in resp.choices)
    assert {c.finish_reason for c in resp.choices} == {"length"}
    assert resp.usage is not None and resp.usage.completion_tokens == 10
    # The chat template wraps the message: more prompt tokens than the message's words.
    assert resp.usage.prompt_tokens > 2


def test_add_generation_prompt_reaches_the_template(client: openai.OpenAI,
                                                   model_name: str) -> None:
    # The tiny template writes "<|assistant|>\n" after the messages only when asked to.
    counts = {}
    for add in (True, False):
        resp = client.chat.completions.create(
            model=model_name, messages=CHAT, max_tokens=1,  # type: ignore[arg-type]
            extra_body={"add_generation_prompt": add})
        assert resp.usage is not None
        counts[add] = resp.usage.prompt_tokens
    assert counts[True] > counts[False]


def test_chat_logprobs_with_top_logprobs(client: openai.OpenAI, model_name: str) -> None:
    resp = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=3,  # type: ignore[arg-type]
                                          logprobs=True, top_logprobs=3,
                                          extra_body={"ignore_eos": True})
    content = resp.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 3
    for entry in content:
        assert entry.logprob <= 0.0 and len(entry.top_logprobs) == 3
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and entry.logprob <= values[0]


def test_streamed_chat_equals_the_whole_one(client: openai.OpenAI, model_name: str) -> None:
    kwargs = {"model": model_name, "messages": CHAT, "max_tokens": 6, "temperature": 0.0,
              "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    deltas = [ch.delta for c in chunks for ch in c.choices]
    assert deltas[0].role == "assistant" and all(d.role is None for d in deltas[1:])
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_bad_input_is_a_400_in_openai_shape(client: openai.OpenAI, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt="Hello", temperature=2.5)
    assert info.value.status_code == 400
    body = info.value.response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == "temperature"
    assert body["error"]["type"] == "invalid_request_error"
    assert "temperature must be in [0, 2]" in body["error"]["message"]


def test_engine_refusal_is_a_400_naming_the_field(client: openai.OpenAI,
                                                  model_name: str) -> None:
    # The vocab bound is checked by the engine's stages, past the front: INVALID_ARGUMENT -> 400.
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt=[1, 999_999], max_tokens=2,
                                  stream=True)
    error = info.value.response.json()["error"]
    assert error["param"] == "prompt_token_ids" and "vocab" in error["message"]


def test_a_refused_request_keeps_its_connection(openai_stack: Stack, model_name: str) -> None:
    # Refused past the front (the engine's vocab bound): the 400 must not close the keep-alive
    # connection under the client's next request.
    host, port = openai_stack.address("openai").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for prompt, status in (([1, 999_999], 400), ("Hi", 200), ([1, 999_999], 400)):
            conn.request("POST", "/v1/completions", json.dumps(
                {"model": model_name, "prompt": prompt, "max_tokens": 1}),
                {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == status
            assert resp.getheader("connection") != "close"
    finally:
        conn.close()


def test_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=CHAT)  # type: ignore[arg-type]
    assert info.value.response.json()["error"]["code"] == "model_not_found"


def test_models_lists_the_served_model(client: openai.OpenAI, model_name: str) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [model_name] and models[0].object == "model"


def test_the_model_path_may_be_spelled_differently(client: openai.OpenAI,
                                                  model_name: str) -> None:
    # `strand serve --model ./dir/` reports "dir": a client may name it as it was given.
    resp = client.completions.create(model=model_name + "/.", prompt="Hi", max_tokens=1)
    assert resp.model == model_name


def test_served_model_names_are_what_clients_name(openai_stack: Stack,
                                                  model_name: str) -> None:
    # A second front on the same gateway, as `strand serve --model smollm2` starts one: the
    # names given, not the directory the model resolved to.
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "strand.services.openai", "--port", str(port),
         "--gateway-addr", openai_stack.gateway_address,
         "--served-model-name", "tiny", "tiny-alias"], cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        _get_until_listening(f"{url}/models", process)
        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60) as c:
            models = c.models.list().data
            assert [m.id for m in models] == ["tiny", "tiny-alias"]
            assert {m.model_extra["root"] for m in models} == {model_name}  # type: ignore[index]
            resp = c.completions.create(model="tiny-alias", prompt="Hi", max_tokens=1)
            assert resp.model == "tiny-alias"  # answered with the name it was asked by
            with pytest.raises(openai.NotFoundError):
                c.completions.create(model=model_name, prompt="Hi", max_tokens=1)
    finally:
        process.terminate()
        process.wait(timeout=10)


def _post(url: str, body: dict, api_key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_tokenize_counts_what_a_chat_request_carries(client: openai.OpenAI, openai_stack: Stack,
                                                     model_name: str) -> None:
    base = f"http://{openai_stack.address('openai')}"
    resp = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=1)  # type: ignore[arg-type]
    status, body = _post(f"{base}/tokenize", {"model": model_name, "messages": CHAT,
                                              "return_token_strs": True})
    assert status == 200 and resp.usage is not None
    assert body["count"] == resp.usage.prompt_tokens == len(body["tokens"])
    assert len(body["token_strs"]) == body["count"]
    status, text = _post(f"{base}/tokenize", {"prompt": "Say hello", "add_special_tokens": False})
    assert status == 200 and text["token_strs"] is None
    status, back = _post(f"{base}/detokenize", {"model": model_name, "tokens": text["tokens"]})
    assert (status, back) == (200, {"prompt": "Say hello"})


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {"prompt": "a", "messages": CHAT}, "prompt"),
    ("/tokenize", {}, "prompt"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
])
def test_tokenize_refusals_are_400s_naming_the_field(openai_stack: Stack, path: str,
                                                    body: dict, param: str) -> None:
    status, answer = _post(f"http://{openai_stack.address('openai')}{path}", body)
    assert status == 400 and answer["error"]["param"] == param


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_chat_template_kwargs_reach_the_tokenizer_stage(openai_stack: Stack, model_name: str,
                                                        path: str) -> None:
    # The tiny model's template reads no extra variable: an unknown one renders as before; one
    # the server sets itself is refused by the tokenizer stage, naming the field.
    url = f"http://{openai_stack.address('openai')}{path}"
    body = {"model": model_name, "messages": CHAT, "max_tokens": 1}
    status, plain = _post(url, body)
    status_kw, with_kwargs = _post(url, {**body, "chat_template_kwargs": {"enable_thinking": 0}})
    assert status == status_kw == 200
    if path == "/tokenize":
        assert with_kwargs["tokens"] == plain["tokens"]
    status, answer = _post(url, {**body, "chat_template_kwargs": {"messages": []}})
    assert status == 400 and answer["error"]["param"] == "chat_template_kwargs"
    assert "chat_template_kwargs.messages" in answer["error"]["message"]


def test_a_prefilled_reply_is_continued(client: openai.OpenAI, openai_stack: Stack,
                                        model_name: str) -> None:
    # vLLM's continue_final_message: the prompt ends inside the assistant's begun reply.
    base = f"http://{openai_stack.address('openai')}"
    turns = [*CHAT, {"role": "assistant", "content": "Hello there"}]
    extra = {"add_generation_prompt": False, "continue_final_message": True}
    status, tokens = _post(f"{base}/tokenize", {"model": model_name, "messages": turns, **extra})
    assert status == 200
    status, text = _post(f"{base}/detokenize", {"model": model_name, "tokens": tokens["tokens"]})
    assert status == 200 and text["prompt"].endswith("<|assistant|>\nHello there")
    resp = client.chat.completions.create(model=model_name, messages=turns, max_tokens=3,  # type: ignore[arg-type]
                                          extra_body=extra)
    assert resp.usage is not None and resp.usage.prompt_tokens == tokens["count"]
    # vLLM's echo: the reply begins with the text it continues, whole and streamed alike.
    echoed = client.chat.completions.create(model=model_name, messages=turns, max_tokens=3,  # type: ignore[arg-type]
                                            temperature=0, extra_body={**extra, "echo": True})
    plain = client.chat.completions.create(model=model_name, messages=turns, max_tokens=3,  # type: ignore[arg-type]
                                           temperature=0, extra_body=extra)
    assert echoed.choices[0].message.content == "Hello there" + (
        plain.choices[0].message.content or "")
    chunks: Any = client.chat.completions.create(model=model_name, messages=turns,  # type: ignore[arg-type]
                                                 max_tokens=3, temperature=0, stream=True,
                                                 extra_body={**extra, "echo": True})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        echoed.choices[0].message.content


@pytest.mark.parametrize("chat", [False, True])
def test_usage_tells_the_prompt_tokens_the_prefix_cache_held(client: openai.OpenAI,
                                                             model_name: str, chat: bool) -> None:
    # The front runs --enable-prompt-tokens-details (vLLM's flag): the same long prompt again
    # finds its full blocks cached.
    text = "kalo mi zu ba ki lo me " * 12
    counts = []
    for _ in range(2):
        if chat:
            resp: Any = client.chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": text}], max_tokens=1)
        else:
            resp = client.completions.create(model=model_name, prompt=text, max_tokens=1)
        counts.append(resp.usage.prompt_tokens_details.cached_tokens)
    assert counts[1] >= 16 and counts[1] % 16 == 0, counts  # whole blocks of 16


def test_tokenize_of_an_unknown_model_is_a_404(openai_stack: Stack) -> None:
    status, answer = _post(f"http://{openai_stack.address('openai')}/tokenize",
                           {"model": "no-such-model", "prompt": "a"})
    assert status == 404 and answer["error"]["code"] == "model_not_found"


def test_an_oversized_body_is_a_413_before_it_is_read(openai_stack: Stack) -> None:
    host, port = openai_stack.address("openai").rsplit(":", 1)
    declared = 300 * 1024**2
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n{" % declared)
        answer = ""
        while not answer.endswith("}}"):
            received = sock.recv(4096).decode()
            assert received, f"the front closed the connection after {answer!r}"
            answer += received
    assert answer.startswith("HTTP/1.1 413")
    assert f"request body must be at most {32 * 1024**2} bytes, got {declared}" in answer
    status, body = _post(f"http://{openai_stack.address('openai')}/v1/completions", {"x": 1})
    assert status == 400  # the front serves on


def test_a_body_that_is_not_json_names_the_body(openai_stack: Stack) -> None:
    request = urllib.request.Request(f"http://{openai_stack.address('openai')}/v1/completions",
                                     b"{not json", {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    error = json.loads(info.value.read())["error"]
    assert info.value.code == 400 and error["message"].startswith("body is not valid JSON")


def _front_metrics(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://{stack.address('openai')}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_requests_by_route_and_status(client: openai.OpenAI, model_name: str,
                                                    openai_stack: Stack) -> None:
    ok = ("strand:openai_requests_total", (("route", "/v1/completions"), ("status", "200")))
    refused = ("strand:openai_requests_total", (("route", "/v1/completions"), ("status", "400")))
    probed = ("strand:openai_requests_total", (("route", "other"), ("status", "404")))
    before = _front_metrics(openai_stack)
    client.completions.create(model=model_name, prompt="Hi", max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_name, prompt="Hi", max_tokens=1, temperature=9)
    for path in ("/no/such/path", "/v1/../etc/passwd-ish"):
        assert _get_status(f"http://{openai_stack.address('openai')}{path}") == 404
    after = _front_metrics(openai_stack)
    assert after[ok] - before.get(ok, 0) == 1
    assert after[refused] - before.get(refused, 0) == 1
    assert after[probed] - before.get(probed, 0) == 2
    duration = ("strand:openai_request_duration_seconds_count", (("route", "/v1/completions"),))
    assert after[duration] - before.get(duration, 0) == 2
    assert ("process_cpu_seconds_total", ()) in after


def _get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_version(openai_stack: Stack) -> None:
    status, body = _get(f"http://{openai_stack.address('openai')}/version")
    assert status == 200 and body == {"version": importlib.metadata.version("strand")}


def test_health(openai_stack: Stack) -> None:
    with urllib.request.urlopen(f"http://{openai_stack.address('openai')}/health") as resp:
        assert resp.status == 200


def test_a_dropped_stream_aborts_its_request(client: openai.OpenAI, model_name: str,
                                             openai_stack: Stack) -> None:
    stream = client.chat.completions.create(model=model_name, messages=CHAT,  # type: ignore[arg-type]
                                            max_tokens=LONG_MAX_TOKENS - 64, stream=True,
                                            extra_body={"ignore_eos": True})
    assert isinstance(stream, openai.Stream)
    assert_dropping_aborts(stream, 3, openai_stack)


def assert_dropping_aborts(stream: openai.Stream[Any], events: int, stack: Stack) -> None:
    """Read a few events of a long stream, close it: its request must be aborted."""
    received = iter(stream)
    for _ in range(events):
        next(received)
    assert engine_num_unfinished(stack) == 1
    stream.close()
    # Thousands of tokens were still to come: only an abort ends the request this soon.
    assert _wait_idle(stack, seconds=20.0)


def test_a_client_leaving_a_non_streaming_request_aborts_it(openai_stack: Stack,
                                                            model_name: str) -> None:
    host, port = openai_stack.address("openai").rsplit(":", 1)
    body = json.dumps({"model": model_name, "prompt": [1, 42, 7], "stream": False,
                       "max_tokens": LONG_MAX_TOKENS - 64, "ignore_eos": True}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        for _ in range(300):  # up to 30 s for the request to reach the engine
            if engine_num_unfinished(openai_stack) == 1:
                break
            time.sleep(0.1)
        assert engine_num_unfinished(openai_stack) == 1
    # Thousands of tokens were still to come: only an abort ends the request this soon.
    assert _wait_idle(openai_stack, seconds=20.0)


def _post_raw(stack: Stack, path: str, body: dict[str, Any], headers: dict[str, str]
              ) -> socket.socket:
    """A POST on a socket left open: the client never leaves, so only a deadline can end it."""
    host, port = stack.address("openai").rsplit(":", 1)
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def test_the_sdks_read_timeout_ends_a_non_streaming_request_in_the_engine(
        openai_stack: Stack, model_name: str) -> None:
    body = {"model": model_name, "prompt": [1, 42, 7], "stream": False,
            "max_tokens": LONG_MAX_TOKENS - 64, "ignore_eos": True}
    started = time.monotonic()
    with _post_raw(openai_stack, "/v1/completions", body,
                   {"x-stainless-read-timeout": "1.5"}) as sock:
        status_line = sock.recv(4096).split(b"\r\n", 1)[0]
        # Open all along: the engine let go of the request because its deadline passed.
        assert _wait_idle(openai_stack, seconds=10.0)
    assert b" 504 " in status_line, status_line
    assert time.monotonic() - started < 10.0


def test_a_proxys_timeout_ends_a_stream_in_the_engine(openai_stack: Stack,
                                                      model_name: str) -> None:
    body = {"model": model_name, "messages": CHAT, "stream": True,
            "max_tokens": LONG_MAX_TOKENS - 64, "ignore_eos": True}
    with _post_raw(openai_stack, "/v1/chat/completions", body,
                   {"x-envoy-expected-rq-timeout-ms": "1500"}) as sock:
        for _ in range(100):  # the stream has started
            if engine_num_unfinished(openai_stack) == 1:
                break
            time.sleep(0.05)
        received = b""
        while b"data: [DONE]" not in received and b'"error"' not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        assert _wait_idle(openai_stack, seconds=10.0)
    # The stream ends before its thousands of tokens, with an error event, not a silent stop.
    assert b'"error"' in received


def test_a_bad_timeout_header_is_a_400_naming_it(client: openai.OpenAI,
                                                 model_name: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.with_options(max_retries=0).completions.create(
            model=model_name, prompt=[1, 42, 7], max_tokens=3,
            extra_headers={"x-envoy-expected-rq-timeout-ms": "-5"})
    assert "x-envoy-expected-rq-timeout-ms" in str(info.value)


def test_an_http_request_is_one_trace_from_its_traceparent_into_the_ring(
        client: openai.OpenAI, model_name: str, otlp_receiver: OtlpReceiver) -> None:
    trace_id = "5b8efff798038103d269b633813fc60c"
    client.completions.create(model=model_name, prompt=[1, 42, 7], max_tokens=3,
                              extra_headers={"traceparent": f"00-{trace_id}-eee19b7ec3c1b174-01"})
    [http] = otlp_receiver.wait_for(lambda s: s.trace_id == trace_id
                                    and s.name == "POST /v1/completions")
    [front] = otlp_receiver.wait_for(lambda s: s.trace_id == trace_id
                                     and s.name == f"text_completion {model_name}")
    assert http.parent_span_id == "eee19b7ec3c1b174"  # the caller's span, from traceparent
    # Under the HTTP server span (FastAPI's own telemetry puts its endpoint span between).
    parents = {x.span_id: x.parent_span_id for x in otlp_receiver.trace(trace_id)}
    ancestors, node = [], front.span_id
    while node in parents:
        node = parents[node]
        ancestors.append(node)
    assert front.service == "strand-openai" and http.span_id in ancestors
    assert front.attributes["gen_ai.operation.name"] == "text_completion"
    assert front.attributes["strand.http.status_code"] == 200
    # The gateway's spans of the same request are in the same trace, under the front's span.
    gateway = otlp_receiver.wait_for(lambda s: s.trace_id == trace_id
                                     and s.service == "strand-gateway")
    assert gateway and any(s.parent_span_id == front.span_id for s in gateway)


@pytest.fixture
def front_without_gateway() -> Iterator[str]:
    """A front with an API key whose gateway address has nothing listening: its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "strand.services.openai", "--port", str(port), "--api-key", "k1",
         "--gateway-addr", f"127.0.0.1:{free_port()}"], cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        _get_until_listening(f"{url}/models", process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_no_gateway_is_a_503(front_without_gateway: str) -> None:
    status, body = _get(f"{front_without_gateway}/models", "k1")
    assert status == 503
    assert body["error"]["code"] == "service_unavailable"
    assert "no strand gateway answering" in body["error"]["message"]


def test_a_wrong_api_key_is_a_401(front_without_gateway: str) -> None:
    with openai.OpenAI(base_url=front_without_gateway, api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as info:
            c.models.list()
    assert info.value.response.json()["error"]["code"] == "invalid_api_key"


def test_tokenize_needs_the_api_key_too(front_without_gateway: str) -> None:
    base = front_without_gateway.removesuffix("/v1")
    for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [1]})):
        status, answer = _post(f"{base}{path}", body)
        assert status == 401 and answer["error"]["code"] == "invalid_api_key"


def _get(url: str, api_key: str | None = None) -> tuple[int, dict[str, dict[str, str]]]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _get_until_listening(url: str, process: subprocess.Popen[bytes]
                         ) -> tuple[int, dict[str, dict[str, str]]]:
    for _ in range(300):
        assert process.poll() is None, "the front exited"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        except urllib.error.URLError:
            time.sleep(0.1)  # not listening yet
    raise AssertionError(f"nothing listened at {url}")


# Structured outputs: random weights leave the constraint all the work; each one ends early.
PAIR_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}},
               "required": ["ok"], "additionalProperties": False}


def test_guided_choice_and_regex_hold_on_completions(client: openai.OpenAI,
                                                     model_name: str) -> None:
    resp = client.completions.create(model=model_name, prompt="Hello", max_tokens=24, n=3,
                                     temperature=1.0, seed=5,
                                     extra_body={"guided_choice": ["red", "green", "blue"]})
    assert all(c.text in ("red", "green", "blue") for c in resp.choices)
    resp = client.completions.create(
        model=model_name, prompt="Hello", max_tokens=24, temperature=0.0,
        extra_body={"structured_outputs": {"regex": "[a-c]{3}-[0-9]{2}"}})
    assert re.fullmatch("[a-c]{3}-[0-9]{2}", resp.choices[0].text)
    assert resp.choices[0].finish_reason == "stop"


def test_response_format_json_schema_holds_on_chat(client: openai.OpenAI,
                                                   model_name: str) -> None:
    # vLLM's disable_any_whitespace rides along in structured_outputs: without it the random
    # model may spend every token on the whitespace JSON allows.
    resp = client.chat.completions.create(  # type: ignore[call-overload]
        model=model_name, messages=CHAT, max_tokens=48, temperature=0.0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "pair", "schema": PAIR_SCHEMA}},
        extra_body={"structured_outputs": {"disable_any_whitespace": True}})
    assert json.loads(resp.choices[0].message.content) in ({"ok": True}, {"ok": False})


def test_a_tools_schema_the_engine_refuses_is_a_400_naming_tools(client: openai.OpenAI,
                                                                model_name: str) -> None:
    # The reply is held to a schema made of the tools' parameters, which the engine refuses
    # under the field that carried it: the client sent tools, so the 400 says tools.
    bad: Any = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": 5}}}
    choices: list[Any] = ["required", {"type": "function", "function": {"name": "f"}}]
    for choice in choices:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                tools=[bad], tool_choice=choice)
        error = info.value.response.json()["error"]
        assert error["param"] == "tools", error
        assert error["message"].startswith("tools: the function parameters are not a JSON "
                                           "schema"), error


@pytest.mark.parametrize(("chat", "field"), [
    (False, "guided_json"), (True, "guided_json"), (True, "structured_outputs"),
    (True, "response_format")])
def test_an_invalid_schema_is_a_400_naming_the_field_it_came_in(
        client: openai.OpenAI, model_name: str, chat: bool, field: str) -> None:
    # The engine refuses it as structured_outputs.json; the client hears of its own field.
    schema = {"type": "object", "properties": 5}
    extra = {"guided_json": schema, "structured_outputs": {"json": schema},
             "response_format": {"type": "json_schema", "json_schema": {
                 "name": "s", "schema": schema}}}[field]
    with pytest.raises(openai.BadRequestError) as info:
        if chat:
            client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=4,  # type: ignore[arg-type]
                                           extra_body={field: extra})
        else:
            client.completions.create(model=model_name, prompt="Hi", max_tokens=4,
                                      extra_body={field: extra})
    error = info.value.response.json()["error"]
    assert error["param"] == field and "invalid" in error["message"], error
