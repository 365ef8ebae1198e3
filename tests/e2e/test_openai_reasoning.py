"""--reasoning-parser on a real stack (`strand serve`'s flags: the engine's and its front's): a
thinking model reasons freely, its answer held to the request's grammar after </think>; the
front answers the reasoning apart, whole and streamed alike."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from strand.services.launch import Stack, StackConfig, launch_stack
from tests.e2e.conftest import ENGINE_FLAGS
from tests.e2e.test_openai import _post
from tests.engine_core.structured_output.thinking_model import build_thinking_model

WORD = "[a-z]{3,6}"
CHAT = [{"role": "user", "content": "hello"}]
PARSER = ["--reasoning-parser", "deepseek_r1"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    model, _ = build_thinking_model(tmp_path_factory.mktemp("thinking"))
    config = StackConfig(model=str(model), engine_args=[*ENGINE_FLAGS, *PARSER],
                         gateway_args=["--auto-step"], openai_port=0, openai_args=PARSER,
                         log_dir=tmp_path_factory.mktemp("reasoning-stack-logs"))
    with launch_stack(config, timeout=120) as running:
        yield running


def _request(stack: Stack, **extra: Any) -> dict[str, Any]:
    base = f"http://{stack.address('openai')}"
    status, tokens = _post(f"{base}/tokenize", {"prompt": "</think>",
                                                "add_special_tokens": False})
    assert status == 200 and len(tokens["tokens"]) == 1
    # A bias makes the random model close its reasoning after a few free tokens.
    return {"model": stack.config.model, "messages": CHAT, "max_tokens": 40, "temperature": 0,
            "logit_bias": {str(tokens["tokens"][0]): 1.5}, "guided_regex": WORD, **extra}


def test_the_reasoning_is_free_and_the_answer_is_held_to_the_grammar(stack: Stack) -> None:
    url = f"http://{stack.address('openai')}/v1/chat/completions"
    status, body = _post(url, _request(stack))
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert re.fullmatch(WORD, message["content"]), message
    assert re.search("[^a-z]", message["reasoning"]), message  # no grammar held it
    assert "</think>" not in message["reasoning"] + message["content"]
    with openai.OpenAI(base_url=f"http://{stack.address('openai')}/v1", api_key="unused",
                       max_retries=0, timeout=60) as client:
        request = _request(stack)
        chunks: Any = client.chat.completions.create(
            model=request["model"], messages=CHAT, max_tokens=40,  # type: ignore[arg-type]
            temperature=0, stream=True, logit_bias=request["logit_bias"],
            extra_body={"guided_regex": WORD})
        deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas) == \
        message["reasoning"]
    assert "".join(d.content or "" for d in deltas) == message["content"]


def test_a_prompt_that_closed_the_reasoning_is_answered_as_content(stack: Stack) -> None:
    url = f"http://{stack.address('openai')}/v1/chat/completions"
    status, body = _post(url, _request(stack, chat_template_kwargs={"enable_thinking": False}))
    message = body["choices"][0]["message"]
    assert status == 200 and re.fullmatch(WORD, message["content"]), body
    assert "reasoning" not in message
    status, body = _post(url, _request(stack, include_reasoning=False))
    message = body["choices"][0]["message"]
    assert status == 200 and "reasoning" not in message and re.fullmatch(WORD,
                                                                         message["content"])


def test_a_response_carries_the_reasoning_as_its_own_item(stack: Stack) -> None:
    request = _request(stack)
    with openai.OpenAI(base_url=f"http://{stack.address('openai')}/v1", api_key="unused",
                       max_retries=0, timeout=60) as client:
        fields: dict[str, Any] = {
            "model": request["model"], "input": "hello", "max_output_tokens": 40,
            "temperature": 0, "extra_body": {"logit_bias": request["logit_bias"],
                                             "guided_regex": WORD}}
        response = client.responses.create(**fields)
        with client.responses.stream(**fields) as stream:
            reasoning_deltas = [e.delta for e in stream
                                if e.type == "response.reasoning_text.delta"]
            streamed = stream.get_final_response()
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"], response.output
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert re.search("[^a-z]", reasoning.content[0].text)
    assert re.fullmatch(WORD, response.output_text)
    assert streamed.output_text == response.output_text
    assert "".join(reasoning_deltas) == reasoning.content[0].text
