"""tests/v1/sample/test_sampling_params_e2e.py: SamplingParams through a whole engine, plus the
fields vLLM users pass (bad_words, detokenize, truncate_prompt_tokens, extra_args) in process
and over the wire (protobuf)."""

from __future__ import annotations

from pathlib import Path

import pytest

from strand.engine_core import LLMEngine
from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from tests.engine_core.conformance.conftest import make_engine, run_to_completion

PROMPT = "kalo mi ne ru sa"


def _generate(engine: LLMEngine, params: SamplingParams, prompt: object = PROMPT,
              request_id: str = "r") -> RequestOutput:
    engine.add_request(request_id, prompt, params)  # type: ignore[arg-type]
    return run_to_completion(engine)[request_id]


def _greedy(**kw: object) -> SamplingParams:
    kw.setdefault("max_tokens", 12)
    return SamplingParams(temperature=0.0, ignore_eos=True, **kw)  # type: ignore[arg-type]


def test_n_gt_1(engine: LLMEngine) -> None:
    out = _generate(engine, SamplingParams(n=3, max_tokens=4, seed=0))
    assert len(out.outputs) == 3


def test_best_of() -> None:
    pytest.skip("missing feature: best_of (deprecated in vLLM v1, which refuses it)")


def test_penalties(engine: LLMEngine) -> None:
    out = _generate(engine, SamplingParams(temperature=1.2, presence_penalty=1.2,
                                           frequency_penalty=1.2, repetition_penalty=1.2,
                                           min_p=0.5, top_p=0.5, top_k=3, max_tokens=6, seed=1))
    assert len(out.outputs[0].token_ids) == 6


def test_stop(engine: LLMEngine) -> None:
    text = _generate(engine, _greedy()).outputs[0].text
    stop = text[3:5]
    assert stop.strip(), "the greedy text must give a usable stop string"
    cut = _generate(engine, _greedy(stop=[stop])).outputs[0]
    assert cut.text == text[:text.index(stop)] and cut.stop_reason == stop
    kept = _generate(engine, _greedy(stop=[stop], include_stop_str_in_output=True)).outputs[0]
    assert kept.text == text[:text.index(stop) + len(stop)]


def test_stop_token_ids(engine: LLMEngine) -> None:
    ids = _generate(engine, _greedy()).outputs[0].token_ids
    first = next(i for i, t in enumerate(ids) if t not in ids[:i])
    stop_a = ids[5] if ids[5] not in ids[:5] else ids[first]
    for stop_ids in ([ids[6], stop_a], [stop_a, ids[6]]):
        out = _generate(engine, _greedy(stop_token_ids=stop_ids)).outputs[0]
        assert out.token_ids[-1] in stop_ids and out.finish_reason == "stop"


def test_detokenize_false(engine: LLMEngine) -> None:
    out = _generate(engine, _greedy(detokenize=False, max_tokens=4))
    assert len(out.outputs[0].token_ids) == 4 and out.outputs[0].text == ""
    out = _generate(engine, _greedy(detokenize=False, max_tokens=4, logprobs=3,
                                    prompt_logprobs=3))
    assert out.outputs[0].text == ""
    sample, prompt = out.outputs[0].logprobs, out.prompt_logprobs
    assert sample is not None and prompt is not None and len(prompt) > 1
    for position in [*prompt[1:], *sample]:
        assert position is not None and 3 <= len(position) <= 4
        assert all(lp.decoded_token is None for lp in position.values())
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(detokenize=False, stop=["x"])


def _word_of(tokenizer: object, ids: list[int]) -> str | None:
    """The text of ids when it tokenizes back to exactly ids (alone or after a space)."""
    text = tokenizer.decode(ids).strip()  # type: ignore[attr-defined]
    if not text or "\ufffd" in text:
        return None
    for form in (text, " " + text):
        if tokenizer.encode(form, add_special_tokens=False) == ids:  # type: ignore[attr-defined]
            return text
    return None


def _contains(ids: list[int], seq: list[int]) -> bool:
    return any(ids[i:i + len(seq)] == seq for i in range(len(ids) - len(seq) + 1))


def test_bad_words(engine: LLMEngine) -> None:
    """Greedy text on a random model is no real words: the bad words are taken from its own
    tokens (a one-token word, then a two-token one) and must not be generated again."""
    tokenizer = engine.get_tokenizer()
    ids = _generate(engine, _greedy(max_tokens=16)).outputs[0].token_ids
    single = next((([t], w) for t in ids if (w := _word_of(tokenizer, [t]))), None)
    assert single is not None, "no greedy token decodes to a word that tokenizes back"
    bad_ids, bad_1 = single
    new_ids = _generate(engine, _greedy(max_tokens=16, bad_words=[bad_1])).outputs[0].token_ids
    assert bad_ids[0] not in new_ids
    pairs = [[a, b] for a, b in zip(new_ids, new_ids[1:], strict=False)]
    double = next(((p, w) for p in pairs if (w := _word_of(tokenizer, p))), None)
    if double is None:
        pytest.skip("no two-token word in this model's greedy output")
    pair, bad_2 = double
    newer = _generate(engine, _greedy(max_tokens=16, bad_words=[bad_1, bad_2])).outputs[0]
    assert bad_ids[0] not in newer.token_ids
    assert not _contains(newer.token_ids, pair)


def test_bad_words_token_ids_from_the_tokenizer(engine: LLMEngine) -> None:
    tokenizer = engine.get_tokenizer()
    processed = engine.input_processor.process("x", PROMPT, _greedy(bad_words=["kalo"]))
    ids = processed.request.sampling_params.bad_words_token_ids
    assert ids is not None and ids[0] == tokenizer.encode("kalo", add_special_tokens=False)


def test_logits_processor() -> None:
    pytest.skip("vLLM v1 refuses per-request callables (SamplingParams.logits_processors); "
                "Strand has no such field: custom processors go through EngineArgs "
                "(see test_logits_processors.py)")


def test_allowed_token_ids(engine: LLMEngine) -> None:
    out = _generate(engine, SamplingParams(allowed_token_ids=[10], max_tokens=3))
    assert out.outputs[0].token_ids == [10, 10, 10]
    for bad in ([], [-1], [10_000_000]):
        with pytest.raises(ValueError, match="allowed_token_ids"):
            engine.add_request("bad", PROMPT, SamplingParams(allowed_token_ids=bad))
    assert not engine.has_unfinished_requests()


def test_priority(engine: LLMEngine) -> None:
    with pytest.raises(ValueError, match="priority"):
        engine.add_request("p", PROMPT, SamplingParams(), priority=[1])  # type: ignore[arg-type]


def test_seed(engine: LLMEngine) -> None:
    texts = [_generate(engine, SamplingParams(seed=s, max_tokens=8), request_id=f"s{i}")
             .outputs[0].token_ids for i, s in enumerate((42, 42, 43))]
    assert texts[0] == texts[1] != texts[2]


def test_truncate_prompt_tokens(engine: LLMEngine) -> None:
    ids = list(range(20, 40))
    out = _generate(engine, _greedy(truncate_prompt_tokens=5, max_tokens=2),
                    {"prompt_token_ids": ids})
    assert out.prompt_token_ids == ids[-5:]
    full = _generate(engine, _greedy(max_tokens=2), {"prompt_token_ids": ids[-5:]})
    assert out.outputs[0].token_ids == full.outputs[0].token_ids
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        engine.add_request("t", PROMPT, SamplingParams(truncate_prompt_tokens=10_000))
    with pytest.raises(ValueError, match="truncate_prompt_tokens must be an integer >= 1 or -1"):
        SamplingParams(truncate_prompt_tokens=0)
    assert SamplingParams(truncate_prompt_tokens=-1).truncate_prompt_tokens == -1


def test_extra_args_validated() -> None:
    assert SamplingParams(extra_args={"a": [1, 2]}).extra_args == {"a": [1, 2]}
    with pytest.raises(ValueError, match="extra_args"):
        SamplingParams(extra_args={1: "x"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="extra_args"):
        SamplingParams(extra_args={"f": object()})


def test_new_fields_round_trip_over_grpc() -> None:
    convert = pytest.importorskip("strand.services.common.convert_params")
    params = SamplingParams(bad_words=["kalo", "mi"], bad_words_token_ids=[[5, 6], [7]],
                            detokenize=False, truncate_prompt_tokens=7,
                            extra_args={"target_token": 3, "tags": ["a"]}, seed=-1)
    assert convert.params_from_pb(convert.params_to_pb(params)) == params
    assert convert.params_from_pb(convert.params_to_pb(SamplingParams())) == SamplingParams()


def test_new_fields_are_validated_over_grpc() -> None:
    convert = pytest.importorskip("strand.services.common.convert_params")
    msg = convert.params_to_pb(SamplingParams())
    msg.truncate_prompt_tokens = 0
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        convert.params_from_pb(msg)
    msg = convert.params_to_pb(SamplingParams())
    msg.extra_args_json = "{not json"
    with pytest.raises(ValueError, match="extra_args"):
        convert.params_from_pb(msg)


def test_max_logprobs_engine_arg(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, max_logprobs=2)
    with pytest.raises(ValueError, match=r"max_logprobs \(2\)"):
        engine.add_request("l", PROMPT, SamplingParams(logprobs=3))
