"""Huge-but-legal requests are refused up front, naming the field and the bound, with messages
that never echo the whole input."""

from __future__ import annotations

import pytest

from strand.engine_core.processing.input_processor import InputProcessor
from strand.engine_core.processing.request_limits import RequestLimits
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams


@pytest.fixture
def processor(tokenizer: Tokenizer) -> InputProcessor:
    return InputProcessor(tokenizer, max_model_len=64, vocab_size=1000,
                          limits=RequestLimits(max_n=4, max_stop_strings=2,
                                               max_stop_string_chars=8, max_logit_bias=3))


@pytest.mark.parametrize(("params", "message"), [
    (dict(n=5, temperature=1.0), "n must be <= 4, got 5"),
    (dict(max_tokens=65), "max_tokens must be <= max_model_len (64), got 65"),
    (dict(stop=["a", "b", "c"]), "stop must be <= 2 strings, got 3"),
    (dict(stop=["x" * 9]), "stop strings must be at most 8 characters each, got one of 9"),
    (dict(logit_bias={1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}), "logit_bias must be <= 3 entries, got 4"),
    (dict(stop_token_ids=list(range(2000))), "stop_token_ids must be <= 1024 ids, got 2000"),
])
def test_each_bound_names_its_field(processor: InputProcessor, params: dict[str, object],
                                    message: str) -> None:
    with pytest.raises(ValueError) as err:
        processor.process("r", "hello", SamplingParams(**params))  # type: ignore[arg-type]
    assert str(err.value) == message


def test_an_oversized_prompt_is_refused_before_it_is_tokenized(
        processor: InputProcessor, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_tokenizing(*args: object, **kwargs: object) -> list[int]:
        raise AssertionError("the tokenizer must not see an oversized prompt")
    monkeypatch.setattr(processor.tokenizer, "encode", no_tokenizing)
    with pytest.raises(ValueError, match=r"prompt must be at most 65536 bytes .* got 70000 bytes"):
        processor.process("r", "x" * 70000, SamplingParams())
    with pytest.raises(ValueError, match="prompt must be at most 65536 bytes"):
        processor.process("r", {"messages": [{"role": "user", "content": "y" * 70000}]},
                          SamplingParams())


def test_error_messages_do_not_echo_unbounded_input() -> None:
    with pytest.raises(ValueError) as err:
        SamplingParams(stop_token_ids=[-1] * 100_000)
    assert len(str(err.value)) < 400
    assert "100000 items" in str(err.value)


def test_seed_error_shows_the_value_given() -> None:
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*63\), got -5"):
        SamplingParams(seed=-5)
