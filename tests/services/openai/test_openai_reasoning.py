"""--reasoning-parser as vLLM answers it: the reasoning apart in `reasoning`, the rest as
content (or the tool calls it holds); whole, or streamed in any pieces with nothing dropped."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from strand.engine_core.chat_config import REASONING_PARSERS
from strand.engine_core.outputs import CompletionOutput, RequestOutput
from strand.engine_core.processing.reasoning import prompt_ends_reasoning
from strand.services.openai.protocol import ChatCompletionRequest
from strand.services.openai.reasoning import Reasoning, reasoning_of
from strand.services.openai.shaping import Shaper
from strand.services.openai.tool_parser import AutoTools
from strand.services.openai.tools import NamedTool

R1_PROMPT = "<｜User｜>2+2?<｜Assistant｜><think>\n"  # R1's template opens the reasoning
QWEN_PROMPT = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"  # the model does
NO_THINK_PROMPT = QWEN_PROMPT + "<think>\n\n</think>\n\n"  # enable_thinking false
REPLY = "Two and two: <b>four</b>, not </thin k>.\n</think>\n\nIt is 4."


def _split(parser: str, prompt: str, text: str, **kw: Any) -> tuple[str | None, str | None]:
    reasoning = Reasoning(parser, **kw)
    reasoning.note_prompt(0, prompt)
    return reasoning.split(0, text)


@pytest.mark.parametrize("parser", sorted(REASONING_PARSERS))
def test_a_reply_is_its_reasoning_then_its_content(parser: str) -> None:
    expected = ("Two and two: <b>four</b>, not </thin k>.\n", "\n\nIt is 4.")
    assert _split(parser, R1_PROMPT, REPLY) == expected
    assert _split(parser, QWEN_PROMPT, "<think>" + REPLY) == expected  # it opened it itself
    assert _split(parser, QWEN_PROMPT, " \n<think>" + REPLY) == expected
    assert _split(parser, R1_PROMPT, "</think>") == ("", None)  # nothing after it
    # Cut short before the closing tag: all reasoning, no content (vLLM's answer).
    assert _split(parser, R1_PROMPT, "still thinking </thi") == ("still thinking </thi", None)


def test_a_prompt_that_closed_the_reasoning_leaves_a_reply_of_content() -> None:
    assert prompt_ends_reasoning(NO_THINK_PROMPT, REASONING_PARSERS["qwen3"])
    # An earlier turn's closed reasoning is history, not the end of this prompt.
    history = "<think>a</think>b<|im_end|>\n" + QWEN_PROMPT
    assert not prompt_ends_reasoning(history, REASONING_PARSERS["qwen3"])
    assert _split("qwen3", NO_THINK_PROMPT, "It is 4.") == (None, "It is 4.")
    # Qwen 3 asked not to think, whatever its template writes: all content.
    assert _split("qwen3", QWEN_PROMPT, "It is 4.", thinking_off=True) == (None, "It is 4.")
    off = reasoning_of(ChatCompletionRequest(messages=[], chat_template_kwargs={
        "enable_thinking": False}), "qwen3")
    assert off is not None and off.thinking_off
    r1 = reasoning_of(ChatCompletionRequest(messages=[], chat_template_kwargs={
        "enable_thinking": False}), "deepseek_r1")
    assert r1 is not None and not r1.thinking_off  # Qwen 3's switch only, as in vLLM
    assert reasoning_of(ChatCompletionRequest(messages=[]), None) is None


TEXTS = [REPLY, "<think>" + REPLY, "  <think>x</think>", "no tags at all <", "<thi",
         "<think>abc</thi", "</think>only content", "<think></think>", "a</think>b</think>c",
         "<", "", "\n\n"]


@pytest.mark.parametrize("prompt", [R1_PROMPT, QWEN_PROMPT, NO_THINK_PROMPT])
def test_a_stream_in_any_pieces_sends_what_the_whole_reply_is(prompt: str) -> None:
    rng = random.Random(0)
    for text in TEXTS:
        whole_reasoning, whole_content = _split("qwen3", prompt, text)
        for _ in range(30):
            cuts = sorted(rng.sample(range(1, len(text)), min(rng.randint(0, 5),
                                                              max(len(text) - 1, 0))))
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            streamed = Reasoning("qwen3")
            streamed.note_prompt(0, prompt)
            sent = [streamed.delta(0, 0, p, k == len(pieces) - 1) for k, p in enumerate(pieces)]
            assert "".join(r for r, _ in sent) == (whole_reasoning or "")
            assert "".join(c for _, c in sent) == (whole_content or "")


def test_a_stream_holds_back_only_what_may_begin_a_tag() -> None:
    streamed = Reasoning("deepseek_r1")
    streamed.note_prompt(0, R1_PROMPT)
    assert streamed.delta(0, 0, "I think </th", last=False) == ("I think ", "")
    assert streamed.delta(0, 0, "is", last=False) == ("</this", "")
    assert streamed.delta(0, 0, "</think>\n4", last=False) == ("", "\n4")
    opened = Reasoning("qwen3")
    opened.note_prompt(0, QWEN_PROMPT)
    assert opened.delta(0, 0, "<thi", last=False) == ("", "")  # may be the opening tag
    assert opened.delta(0, 0, "nk>hm", last=False) == ("hm", "")


def _output(text: str, finished: bool, prompt: str = R1_PROMPT) -> RequestOutput:
    return RequestOutput("r", prompt, [1, 2], [CompletionOutput(
        0, text, [3], finish_reason="stop" if finished else None)], finished)


def _deltas(shaper: Shaper, pieces: list[str]) -> list[dict[str, Any]]:
    events = [e for k, p in enumerate(pieces)
              for e in shaper.chunks(0, _output(p, k == len(pieces) - 1), False)]
    return [json.loads(e[len("data: "):])["choices"][0]["delta"] for e in events]


def test_the_message_and_the_deltas_carry_the_reasoning_apart() -> None:
    shaper = Shaper(chat=True, model="m", n=1, reasoning=Reasoning("deepseek_r1"))
    message = shaper.response([_output(REPLY, True)])["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "\n\nIt is 4.",
                       "reasoning": "Two and two: <b>four</b>, not </thin k>.\n"}
    cut = Shaper(chat=True, model="m", n=1, reasoning=Reasoning("deepseek_r1"))
    assert cut.response([_output("hmm", True)])["choices"][0]["message"] == {
        "role": "assistant", "content": None, "reasoning": "hmm"}
    streamer = Shaper(chat=True, model="m", n=1, reasoning=Reasoning("deepseek_r1"))
    deltas = _deltas(streamer, [REPLY[i:i + 5] for i in range(0, len(REPLY), 5)])
    assert deltas[0]["role"] == "assistant" and all("role" not in d for d in deltas[1:])
    assert "".join(d.get("reasoning", "") for d in deltas) == message["reasoning"]
    assert "".join(d.get("content", "") for d in deltas) == message["content"]
    assert all("content" not in d for d in deltas if "reasoning" in d)


def test_include_reasoning_false_leaves_it_out() -> None:
    shaper = Shaper(chat=True, model="m", n=1,
                    reasoning=Reasoning("deepseek_r1", include=False))
    message = shaper.response([_output(REPLY, True)])["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "\n\nIt is 4."}


HERMES_AFTER = ('weigh it</think>\n\nLet me call.\n<tool_call>\n{"name": "f", "arguments": '
                '{"n": 1}}\n</tool_call>')


def test_an_auto_tool_parser_reads_what_follows_the_reasoning() -> None:
    shaper = Shaper(chat=True, model="m", n=1, tool=AutoTools("hermes"),
                    reasoning=Reasoning("deepseek_r1"))
    choice = shaper.response([_output(HERMES_AFTER, True)])["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning"] == "weigh it"
    assert choice["message"]["content"] == "Let me call."
    assert [c["function"]["arguments"] for c in choice["message"]["tool_calls"]] == ['{"n": 1}']
    streamer = Shaper(chat=True, model="m", n=1, tool=AutoTools("hermes"),
                      reasoning=Reasoning("deepseek_r1"))
    deltas = _deltas(streamer, [HERMES_AFTER[i:i + 4] for i in range(0, len(HERMES_AFTER), 4)])
    assert "".join(d.get("reasoning", "") for d in deltas) == "weigh it"
    assert [c["function"]["name"] for d in deltas for c in d.get("tool_calls", [])] == ["f"]
    assert [d for d in deltas if "role" in d] == deltas[:1]


def test_a_named_tools_arguments_are_what_follows_the_reasoning() -> None:
    text = 'pick n</think>{"n": 2}'
    shaper = Shaper(chat=True, model="m", n=1, tool=NamedTool("f", {}),
                    reasoning=Reasoning("deepseek_r1"))
    message = shaper.response([_output(text, True)])["choices"][0]["message"]
    assert message["reasoning"] == "pick n"
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"n": 2}'}
    streamer = Shaper(chat=True, model="m", n=1, tool=NamedTool("f", {}),
                      reasoning=Reasoning("deepseek_r1"))
    deltas = _deltas(streamer, [text[i:i + 3] for i in range(0, len(text), 3)])
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "f" and "id" in calls[0]
    assert "".join(c["function"]["arguments"] for c in calls) == '{"n": 2}'
    assert [d for d in deltas if "role" in d] == deltas[:1]
