"""InputProcessor: every prompt form, and every bad input refused with the field's name."""

from __future__ import annotations

from typing import Any

import pytest

from strand.engine_core.processing.input_processor import InputProcessor
from strand.engine_core.processing.output_processor import OutputProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams

from .conftest import TINY_VOCAB_SIZE

MAX_MODEL_LEN = 64


@pytest.fixture
def processor(tokenizer: Tokenizer) -> InputProcessor:
    return InputProcessor(tokenizer, MAX_MODEL_LEN, TINY_VOCAB_SIZE)


def test_text_prompt_is_tokenized_with_bos(processor: InputProcessor, tokenizer: Tokenizer) -> None:
    processed = processor.process("r", "kalo mi", SamplingParams(max_tokens=5), arrival_time=7.0)
    request = processed.request
    assert processed.prompt == "kalo mi"
    assert request.prompt_token_ids == tokenizer.encode("kalo mi")
    assert request.prompt_token_ids[0] == tokenizer.bos_token_id
    assert (request.request_id, request.arrival_time, request.eos_token_id) == ("r", 7.0, 2)
    assert request.sampling_params.max_tokens == 5


def test_prompt_dict_with_cache_salt(processor: InputProcessor, tokenizer: Tokenizer) -> None:
    processor.priority_scheduling = True
    processed = processor.process("r", {"prompt": "mi", "cache_salt": "s1"}, priority=3)
    assert processed.request.prompt_token_ids == tokenizer.encode("mi")
    assert (processed.request.cache_salt, processed.request.priority) == ("s1", 3)


def test_a_priority_the_scheduler_would_ignore_is_refused(processor: InputProcessor) -> None:
    # vLLM's rule: under fcfs a priority would be dropped unseen.
    with pytest.raises(ValueError, match="priority 3 needs scheduling_policy 'priority'"):
        processor.process("r", "mi", priority=3)
    assert processor.process("r", "mi", priority=0).request.priority == 0


def test_token_id_prompt_is_passed_through(processor: InputProcessor) -> None:
    processed = processor.process("r", {"prompt_token_ids": [5, 6, 7]})
    assert processed.request.prompt_token_ids == [5, 6, 7]
    assert processed.prompt is None


def test_chat_prompt_is_rendered_and_has_a_single_bos(
    processor: InputProcessor, tokenizer: Tokenizer
) -> None:
    messages = [{"role": "user", "content": "hi"}]
    processed = processor.process("r", {"messages": messages})
    assert processed.prompt == "<s><|user|>\nhi<|end|>\n<|assistant|>\n"
    ids = processed.request.prompt_token_ids
    assert ids == tokenizer.encode(processed.prompt, add_special_tokens=False)
    assert tokenizer.bos_token_id is not None
    assert ids.count(tokenizer.bos_token_id) == 1


def test_max_tokens_none_fills_the_rest_of_the_context(processor: InputProcessor) -> None:
    processed = processor.process("r", {"prompt_token_ids": [5] * 10}, SamplingParams(max_tokens=None))
    assert processed.request.sampling_params.max_tokens == MAX_MODEL_LEN - 10


def test_caller_params_are_not_shared_with_the_engine(processor: InputProcessor) -> None:
    params = SamplingParams(max_tokens=None)
    processed = processor.process("r", "mi", params)
    assert processed.request.sampling_params is not params
    assert params.max_tokens is None


def test_default_params_when_none_given(processor: InputProcessor) -> None:
    assert processor.process("r", "mi").request.sampling_params == SamplingParams()


# Each bad value is set on a valid SamplingParams after construction, so the input processor's own
# re-validation is what must catch it (construction alone raises the same way).
BAD_PARAMS: list[tuple[str, Any, dict[str, Any]]] = [
    ("n", 0, {}),
    ("temperature", 2.5, {}),
    ("temperature", -0.1, {}),
    ("top_p", 0.0, {}),
    ("top_p", 1.5, {}),
    ("top_k", -2, {}),
    ("min_p", 1.5, {}),
    ("presence_penalty", 2.5, {}),
    ("frequency_penalty", -2.5, {}),
    ("repetition_penalty", 0.0, {}),
    ("max_tokens", 0, {}),
    ("min_tokens", -1, {}),
    ("min_tokens", 10, {"max_tokens": 5}),
    ("logprobs", 21, {}),
    ("prompt_logprobs", 21, {}),
    ("stop", ["ok", ""], {}),
    ("n", 2, {"temperature": 0.0}),
    ("stop_token_ids", [TINY_VOCAB_SIZE], {}),
    ("allowed_token_ids", [-1], {}),
    ("logit_bias", {TINY_VOCAB_SIZE + 1: 1.0}, {}),
    # Only EOS (id 2) and stop ids allowed while min_tokens masks them: nothing left to sample.
    ("allowed_token_ids", [2, 7], {"min_tokens": 3, "stop_token_ids": [7]}),
]


@pytest.mark.parametrize(("field", "value", "others"), BAD_PARAMS)
def test_bad_sampling_param_is_refused_naming_it(
    processor: InputProcessor,
    output_processor: OutputProcessor,
    field: str,
    value: Any,
    others: dict[str, Any],
) -> None:
    params = SamplingParams(**others)
    setattr(params, field, value)
    with pytest.raises(ValueError, match=field):
        output_processor.add_request(processor.process("r", "mi", params))
    assert not output_processor.has_request("r")
    assert output_processor.get_num_unfinished_requests() == 0


def test_allowed_stop_tokens_are_fine_once_min_tokens_is_zero_or_eos_ignored(
    processor: InputProcessor,
) -> None:
    processor.process("a", "mi", SamplingParams(allowed_token_ids=[2, 7], stop_token_ids=[7]))
    processor.process("b", "mi", SamplingParams(allowed_token_ids=[2], min_tokens=2,
                                                ignore_eos=True))


@pytest.mark.parametrize(("field", "value"), [("logprobs", 6), ("prompt_logprobs", 6)])
def test_logprobs_above_the_engine_max_logprobs_are_refused(
    tokenizer: Tokenizer, field: str, value: int
) -> None:
    processor = InputProcessor(tokenizer, MAX_MODEL_LEN, TINY_VOCAB_SIZE, max_logprobs=5)
    with pytest.raises(ValueError, match=rf"{field} must be <= max_logprobs \(5\)"):
        processor.process("r", "mi", SamplingParams(**{field: value}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        ("", "prompt must not be empty"),
        ({"prompt": ""}, "prompt must not be empty"),
        ({"prompt_token_ids": []}, "prompt must not be empty"),
        ({"prompt_token_ids": [1, TINY_VOCAB_SIZE]}, r"prompt_token_ids must be in \[0, 400\)"),
        ({"prompt_token_ids": [-1]}, "prompt_token_ids"),
        ({"prompt_token_ids": [1] * (MAX_MODEL_LEN + 1)}, r"max_model_len \(64\)"),
        ({"prompt_token_ids": "1 2"}, "prompt_token_ids must be a list of ints"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user"}]}, r"messages\[0\]"),
        ({"text": "hi"}, "unknown keys"),
        (42, "prompt must be a str or a dict"),
        ({"prompt": "hi", "cache_salt": ""}, "cache_salt"),
    ],
)
def test_bad_prompt_is_refused_naming_the_field(
    processor: InputProcessor, prompt: Any, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        processor.process("r", prompt)


def test_prompt_of_exactly_max_model_len_is_accepted(processor: InputProcessor) -> None:
    processed = processor.process("r", {"prompt_token_ids": [5] * MAX_MODEL_LEN})
    assert len(processed.request.prompt_token_ids) == MAX_MODEL_LEN


def test_request_id_must_be_a_str(processor: InputProcessor) -> None:
    with pytest.raises(ValueError, match="request_id must be a str"):
        processor.process(7, "mi")  # type: ignore[arg-type]


def test_request_id_in_use_is_refused_and_the_first_request_kept(
    processor: InputProcessor, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(processor.process("r", "mi"))
    with pytest.raises(ValueError, match="request_id 'r' already in use"):
        output_processor.add_request(processor.process("r", "kalo"))
    assert output_processor.get_num_unfinished_requests() == 1


def test_child_id_colliding_with_a_live_request_is_refused(
    processor: InputProcessor, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(processor.process("0_r", "mi"))
    with pytest.raises(ValueError, match="request_id '0_r' already in use"):
        output_processor.add_request(processor.process("r", "mi", SamplingParams(n=2)))
    assert not output_processor.has_request("r")
    assert output_processor.get_num_unfinished_requests() == 1
