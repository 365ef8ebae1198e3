"""SamplingParams, PoolingParams and prompts survive pb round trips; bad values are named like
the dataclass does."""

from __future__ import annotations

import pytest

from strand.engine_core.pooling.params import PoolingParams
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.engine_core.structured_output.params import StructuredOutputsParams
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert import (
    params_from_pb,
    params_to_pb,
    prompt_from_pb,
    prompt_to_pb,
)
from strand.services.common.convert_pooling import pooling_params_from_pb, pooling_params_to_pb


def test_every_sampling_param_round_trips() -> None:
    params = SamplingParams(
        n=3, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, presence_penalty=0.5,
        frequency_penalty=-0.5, repetition_penalty=1.2, seed=1234, max_tokens=77, min_tokens=3,
        stop=["\n", "END"], stop_token_ids=[5, 9], include_stop_str_in_output=True,
        ignore_eos=True, logprobs=5, prompt_logprobs=2, logit_bias={3: -1.5, 7: 2.0},
        allowed_token_ids=[3, 7, 11], skip_special_tokens=False,
        spaces_between_special_tokens=False, output_kind=RequestOutputKind.DELTA)
    assert params_from_pb(params_to_pb(params)) == params


@pytest.mark.parametrize("so", [
    StructuredOutputsParams(json='{"type": "object"}', disable_any_whitespace=True),
    StructuredOutputsParams(regex=r"\d+"),
    StructuredOutputsParams(choice=["a", 'b"c']),
    StructuredOutputsParams(grammar='root ::= "x"'),
    StructuredOutputsParams(json_object=True),
])
def test_structured_outputs_round_trip(so: StructuredOutputsParams) -> None:
    assert params_from_pb(params_to_pb(SamplingParams(structured_outputs=so))) == \
        SamplingParams(structured_outputs=so)


def test_structured_outputs_dict_schema_travels_as_json_text() -> None:
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json={"type": "string"}))
    assert params_to_pb(params).structured_outputs.json == '{"type": "string"}'


def test_structured_outputs_without_a_kind_is_refused() -> None:
    msg = pb.SamplingParams(structured_outputs=pb.StructuredOutputsParams(json_object=False))
    with pytest.raises(ValueError, match="structured_outputs must set exactly one"):
        params_from_pb(msg)


def test_default_sampling_params_round_trip() -> None:
    assert params_from_pb(params_to_pb(SamplingParams())) == SamplingParams()


def test_empty_message_gives_the_dataclass_defaults() -> None:
    assert params_from_pb(pb.SamplingParams()) == SamplingParams()


def test_unlimited_max_tokens_round_trips_as_none() -> None:
    params = SamplingParams(max_tokens=None)
    msg = params_to_pb(params)
    assert msg.max_tokens_unlimited and not msg.HasField("max_tokens")
    assert params_from_pb(msg).max_tokens is None


def test_zero_temperature_is_kept_not_defaulted() -> None:
    assert params_from_pb(params_to_pb(SamplingParams(temperature=0.0))).temperature == 0.0


def test_out_of_range_temperature_raises_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"temperature must be in \[0, 2\]"):
        params_from_pb(pb.SamplingParams(temperature=3.0))


def test_unknown_output_kind_raises_naming_the_field() -> None:
    with pytest.raises(ValueError, match="output_kind"):
        params_from_pb(pb.SamplingParams(output_kind=7))  # type: ignore[arg-type]


@pytest.mark.parametrize("prompt", [
    "plain text",
    {"prompt": "text with salt", "cache_salt": "s1"},
    {"prompt": "a query", "text_pair": "a document"},  # a cross-encoder's pair
    {"prompt_token_ids": [1, 2, 3]},
    {"prompt_token_ids": [4, 5], "cache_salt": "s2"},
    {"prompt_token_ids": [4, 5], "prompt": "the text they came from"},
    {"messages": [{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "hi"}]},
    {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "hi"}],
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    {"messages": [{"role": "user", "content": "hi"},  # a tool call and its result
                  {"role": "assistant", "content": "", "tool_calls": [{
                      "id": "c1", "type": "function",
                      "function": {"name": "f", "arguments": {"n": 1}}}]},
                  {"role": "tool", "content": "2", "tool_call_id": "c1", "name": "f"}]},
    {"messages": [{"role": "user", "content": "hi"},  # a thinking model's turn and kwargs
                  {"role": "assistant", "content": "4", "reasoning": "2+2"}],
     "chat_template_kwargs": {"enable_thinking": False, "depth": [1, {"a": None}]}},
    {"messages": [{"role": "user", "content": "hi"},  # a reply the client began
                  {"role": "assistant", "content": "Hello"}],
     "add_generation_prompt": False, "continue_final_message": True},
])
def test_prompt_forms_round_trip(prompt: str | dict) -> None:
    assert prompt_from_pb(prompt_to_pb(prompt)) == prompt


def test_tool_calls_that_are_not_json_are_refused_naming_the_message() -> None:
    msg = prompt_to_pb({"messages": [{"role": "user", "content": "hi"}]})
    msg.chat.messages.add(role="assistant", content="", tool_calls_json="[{")
    with pytest.raises(ValueError, match=r"messages\[1\]\.tool_calls must be JSON"):
        prompt_from_pb(msg)


def test_dict_prompt_with_only_text_comes_back_as_text() -> None:
    assert prompt_from_pb(prompt_to_pb({"prompt": "hello"})) == "hello"


def test_empty_prompt_message_raises_naming_prompt() -> None:
    with pytest.raises(ValueError, match="prompt must be set"):
        prompt_from_pb(pb.Prompt())


def test_dict_prompt_without_known_key_raises() -> None:
    with pytest.raises(ValueError, match="prompt must have one of the keys"):
        prompt_to_pb({"cache_salt": "s"})


def test_unknown_prompt_keys_are_refused_not_dropped() -> None:
    with pytest.raises(ValueError, match=r"prompt has unknown keys \['cache_slat'\]"):
        prompt_to_pb({"prompt": "hi", "cache_slat": "s"})


@pytest.mark.parametrize("params", [
    PoolingParams(),
    PoolingParams(truncate_prompt_tokens=5, normalize=False, task="embed"),
    PoolingParams(dimensions=16),  # a matryoshka width
    PoolingParams(task="classify", use_activation=False),
    PoolingParams(task="score", use_activation=True, truncate_prompt_tokens=-1),
])
def test_pooling_params_round_trip(params: PoolingParams) -> None:
    assert pooling_params_from_pb(pooling_params_to_pb(params)) == params


def test_a_pooling_task_not_known_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="task must be one of"):
        pooling_params_from_pb(pb.PoolingParams(task="reward"))
