"""tests/v1/sample/test_logprobs.py: the engine's max_logprobs, logprobs=-1, and the UTF-8
correction of decoded_token (vLLM's TestCorrectDecodedToken)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from strand.engine_core import EngineArgs, LLMEngine, RequestOutput
from strand.engine_core.core.runner_output import LogprobsLists
from strand.engine_core.outputs import Logprob
from strand.engine_core.processing.logprobs import LogprobsProcessor, decode_token
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams
from tests.engine_core.conformance.conftest import make_engine, run_to_completion

PROMPT = "kalo mi ne ru"


def _generate(engine: LLMEngine, params: SamplingParams, request_id: str = "r") -> RequestOutput:
    engine.add_request(request_id, PROMPT, params)
    return run_to_completion(engine)[request_id]


def _sample(out: RequestOutput) -> list[dict[int, Logprob]]:
    logprobs = out.outputs[0].logprobs
    assert logprobs is not None
    return logprobs


def _prompt(out: RequestOutput) -> list[dict[int, Logprob]]:
    """Prompt positions 1.. (position 0 has no logprob)."""
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    positions = out.prompt_logprobs[1:]
    assert all(p is not None for p in positions)
    return positions  # type: ignore[return-value]


def test_max_logprobs(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, max_logprobs=1)
    with pytest.raises(ValueError, match=r"logprobs must be <= max_logprobs \(1\), got 2"):
        engine.add_request("a", PROMPT, SamplingParams(logprobs=2))
    with pytest.raises(ValueError, match=r"prompt_logprobs must be <= max_logprobs \(1\), got 3"):
        engine.add_request("b", PROMPT, SamplingParams(prompt_logprobs=3))
    assert not engine.has_unfinished_requests()
    out = _generate(engine, SamplingParams(logprobs=1, max_tokens=2, temperature=0.0))
    assert all(len(position) in (1, 2) for position in _sample(out))


def test_max_logprobs_above_the_old_constant(tiny_model_dir: Path) -> None:
    """max_logprobs is the engine's setting: 30 > 20 is allowed when the engine says so."""
    engine = make_engine(tiny_model_dir, max_logprobs=30)
    out = _generate(engine, SamplingParams(logprobs=30, max_tokens=1, temperature=0.0))
    assert len(_sample(out)[0]) in (30, 31)


def test_max_logprobs_engine_arg_is_validated() -> None:
    with pytest.raises(ValueError, match="max_logprobs must be >= -1"):
        EngineArgs(max_logprobs=-2)


def test_none_logprobs(engine: LLMEngine) -> None:
    out = _generate(engine, SamplingParams(max_tokens=3, temperature=0.0))
    assert out.outputs[0].logprobs is None
    assert out.outputs[0].cumulative_logprob is None
    assert out.prompt_logprobs is None


def test_zero_logprobs(engine: LLMEngine) -> None:
    out = _generate(engine, SamplingParams(max_tokens=3, logprobs=0, prompt_logprobs=0,
                                           temperature=0.0))
    sample = _sample(out)
    assert len(sample) == 3
    for token_id, position in zip(out.outputs[0].token_ids, sample, strict=True):
        assert list(position) == [token_id]  # only the sampled token
    assert all(len(p) == 1 for p in _prompt(out))
    cumulative = out.outputs[0].cumulative_logprob
    assert cumulative is not None
    total = sum(p[t].logprob for t, p in zip(out.outputs[0].token_ids, sample, strict=True))
    assert math.isclose(cumulative, total)


def test_all_logprobs(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, max_logprobs=-1)
    vocab = engine.engine_core.vocab_size
    out = _generate(engine, SamplingParams(max_tokens=2, logprobs=-1, temperature=0.0))
    for position in _sample(out):
        assert len(position) == vocab
        assert sorted(p.rank or 0 for p in position.values()) == list(range(1, vocab + 1))
        assert math.isclose(sum(math.exp(p.logprob) for p in position.values()), 1.0,
                            rel_tol=1e-4)


def test_all_logprobs_refused_under_a_max_logprobs_cap(engine: LLMEngine) -> None:
    with pytest.raises(ValueError, match=r"logprobs must be <= max_logprobs \(20\), got -1"):
        engine.add_request("x", PROMPT, SamplingParams(logprobs=-1))


# ---- TestCorrectDecodedToken: byte-fallback tokens never reported as a lone U+FFFD ----------

def _bytes_of(tokenizer: Tokenizer, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > 1, f"{text!r} must split into several tokens for this test"
    return ids


def test_correct_decoded_token_completes_the_character(tokenizer: Tokenizer) -> None:
    ids = _bytes_of(tokenizer, "😀")  # 4 UTF-8 bytes, several tokens
    shares = [decode_token(tokenizer, t, ids[:i]) for i, t in enumerate(ids)]
    assert shares[:-1] == [""] * (len(ids) - 1)  # incomplete so far
    assert shares[-1] == "😀"


def test_correct_decoded_token_without_context_is_empty(tokenizer: Tokenizer) -> None:
    ids = _bytes_of(tokenizer, "😀")
    assert decode_token(tokenizer, ids[-1], []) == ""


def test_correct_decoded_token_keeps_ordinary_tokens(tokenizer: Tokenizer) -> None:
    token = tokenizer.encode("ka", add_special_tokens=False)
    assert len(token) == 1
    assert decode_token(tokenizer, token[0], _bytes_of(tokenizer, "😀")[:2]) == "ka"


def test_correct_decoded_token_gives_only_its_share(tokenizer: Tokenizer) -> None:
    ids = _bytes_of(tokenizer, "é")
    word = tokenizer.encode("ka", add_special_tokens=False)
    # The text of the earlier, complete token is not this token's.
    assert decode_token(tokenizer, ids[1], [*word, ids[0]]) == "é"


def test_sample_logprobs_decoded_tokens_are_corrected(tokenizer: Tokenizer) -> None:
    ids = _bytes_of(tokenizer, "😀")
    other = tokenizer.encode("ka", add_special_tokens=False)[0]
    processor = LogprobsProcessor(tokenizer, 1, None, prompt_token_ids=[other])
    for i, token_id in enumerate(ids):
        alternative = ids[(i + 1) % len(ids)]  # a byte token as the top-1 alternative
        processor.update_sample(LogprobsLists([[token_id, alternative]], [[-0.1, -0.2]], [1]))
    assert processor.logprobs is not None
    texts = [position[t].decoded_token for position, t in zip(processor.logprobs, ids, strict=True)]
    assert texts == [""] * (len(ids) - 1) + ["😀"]
    for position in processor.logprobs:
        assert all(p.decoded_token != "\ufffd" for p in position.values())


def test_prompt_logprobs_decoded_tokens_are_corrected(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("ka😀", add_special_tokens=False)
    processor = LogprobsProcessor(tokenizer, None, 0, prompt_token_ids=prompt)
    rows = LogprobsLists([[t] for t in prompt[1:]], [[-1.0] for _ in prompt[1:]],
                         [1 for _ in prompt[1:]])
    processor.update_prompt(rows)
    assert processor.prompt_logprobs is not None
    positions = processor.prompt_logprobs[1:]
    texts = [p[t].decoded_token if p is not None else None
             for p, t in zip(positions, prompt[1:], strict=True)]
    assert all(isinstance(text, str) for text in texts)
    assert "".join(t for t in texts if t is not None) == "😀"
    assert all("\ufffd" not in (text or "") for text in texts)
