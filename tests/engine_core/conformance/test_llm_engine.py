"""tests/v1/engine/test_llm_engine.py: LLMEngine end to end on the tiny model: parallel
sampling, stream_interval, metrics, and the batch queue giving the same outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from strand.engine_core import LLMEngine
from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.engine_core.structured_output.params import StructuredOutputsParams
from tests.conftest import copy_without_tokenizer
from tests.engine_core.conformance.conftest import make_engine, run_to_completion

PROMPTS = ["kalo mi ne ru sa", "to vi el an", "or is th qu ing ber con", "dra fel"]


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("kind", [RequestOutputKind.FINAL_ONLY, RequestOutputKind.CUMULATIVE])
def test_parallel_sampling(engine: LLMEngine, n: int, kind: RequestOutputKind) -> None:
    params = SamplingParams(n=n, max_tokens=4, seed=3, output_kind=kind)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"p{i}", prompt, params)
    seen: dict[str, set[int]] = {}
    final: dict[str, list] = {}
    for _ in range(100):
        if not engine.has_unfinished_requests():
            break
        step_outputs = [o for o in engine.step() if isinstance(o, RequestOutput)]
        ids = [o.request_id for o in step_outputs]
        assert len(ids) == len(set(ids)), "one RequestOutput per parent per step"
        for out in step_outputs:
            seen.setdefault(out.request_id, set()).update(c.index for c in out.outputs)
            if out.finished:
                final[out.request_id] = out.outputs
    assert set(final) == {f"p{i}" for i in range(len(PROMPTS))}
    for rid, outputs in final.items():
        assert seen[rid] == set(range(n))
        if kind == RequestOutputKind.FINAL_ONLY:
            assert sorted(c.index for c in outputs) == list(range(n))
            assert all(len(c.token_ids) == 4 for c in outputs)


def test_stream_interval(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, stream_interval=3)
    engine.add_request("r", PROMPTS[0], SamplingParams(max_tokens=7, temperature=0.0,
                                                       ignore_eos=True,
                                                       output_kind=RequestOutputKind.DELTA))
    counts: list[int] = []
    for _ in range(50):
        if not engine.has_unfinished_requests():
            break
        counts.extend(len(o.outputs[0].token_ids) for o in engine.step()
                      if isinstance(o, RequestOutput))
    # The first token, then every third one, the last with what is left.
    assert counts == [1, 3, 3]


def test_engine_metrics(engine: LLMEngine) -> None:
    prompt = {"prompt_token_ids": list(range(50, 90))}  # two full blocks of 16 shared
    engine.add_request("m0", prompt, SamplingParams(max_tokens=2))
    engine.add_request("m1", prompt, SamplingParams(max_tokens=2))
    run_to_completion(engine)
    stats = engine.get_stats()
    for key in ("num_running_reqs", "num_waiting_reqs", "kv_cache_usage",
                "prefix_cache_hit_rate", "prefix_cache_recent_hit_rate"):
        assert key in stats
    assert stats["num_running_reqs"] == 0 and stats["prefix_cache_recent_hit_rate"] > 0


def test_batch_queue_outputs_match(tiny_model_dir: Path) -> None:
    """max_concurrent_batches=2 (schedule N+1 while N computes) changes no output."""
    def run(**overrides: object) -> dict[str, list[list[int]]]:
        engine = make_engine(tiny_model_dir, max_num_batched_tokens=16, max_num_seqs=3,
                             **overrides)
        for i, prompt in enumerate(PROMPTS):
            final = RequestOutputKind.FINAL_ONLY  # all n children in the last output
            params = (SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True) if i % 2
                      else SamplingParams(n=2, seed=i, max_tokens=6, output_kind=final))
            engine.add_request(f"q{i}", prompt, params)
        done = run_to_completion(engine)
        pool = engine.engine_core.scheduler.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_blocks - 1
        return {rid: [c.token_ids for c in out.outputs] for rid, out in done.items()}

    assert run(max_concurrent_batches=2) == run()


def test_skip_tokenizer_initialization(tiny_model_dir: Path, tmp_path: Path) -> None:
    """vLLM's test: with skip_tokenizer_init no tokenizer is loaded (here the model's directory
    has no tokenizer files at all), a text prompt is refused, and a token-id prompt gives token
    ids with text "" (detokenize=True notwithstanding) and logprobs without decoded tokens."""
    model = copy_without_tokenizer(tiny_model_dir, tmp_path / "no-tokenizer")
    with pytest.raises(Exception):  # noqa: B017 - whatever the loader says: the files are gone
        make_engine(model)
    engine = make_engine(model, skip_tokenizer_init=True)
    params = SamplingParams(prompt_logprobs=1, logprobs=1, detokenize=True, max_tokens=6,
                            temperature=0.0)
    with pytest.raises(ValueError, match="cannot pass text prompts when"):
        engine.add_request("text", "abc", params)
    with pytest.raises(ValueError, match="cannot pass text prompts when"):
        engine.add_request("chat", {"messages": [{"role": "user", "content": "hi"}]}, params)
    assert not engine.has_unfinished_requests()  # refused, nothing added
    engine.add_request("ids", {"prompt_token_ids": [1, 2, 3]}, params)
    out = run_to_completion(engine)["ids"]
    completion = out.outputs[0]
    assert completion.text == "" and completion.token_ids
    assert completion.logprobs is not None and out.prompt_logprobs is not None
    assert all(lp.decoded_token is None for position in completion.logprobs
               for lp in position.values())
    assert all(lp.decoded_token is None for position in out.prompt_logprobs[1:]
               if position is not None for lp in position.values())
    # The same weights with their tokenizer: the same greedy tokens (EOS from the config).
    oracle = make_engine(tiny_model_dir)
    oracle.add_request("ids", {"prompt_token_ids": [1, 2, 3]}, params)
    assert run_to_completion(oracle)["ids"].outputs[0].token_ids == completion.token_ids


@pytest.mark.parametrize(("params", "field"), [
    (SamplingParams(stop=["x"]), "stop strings"),
    (SamplingParams(bad_words=["x"]), "bad_words"),
    (SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+")),
     "structured_outputs"),
])
def test_without_a_tokenizer_what_needs_text_is_refused_by_name(
        tiny_model_dir: Path, params: SamplingParams, field: str) -> None:
    engine = make_engine(tiny_model_dir, skip_tokenizer_init=True)
    with pytest.raises(ValueError, match=f"{field} need a tokenizer, but skip_tokenizer_init"):
        engine.add_request("r", {"prompt_token_ids": [1, 2, 3]}, params)
    assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="skip_tokenizer_init is True"):
        engine.get_tokenizer()
