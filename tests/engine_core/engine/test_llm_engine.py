"""LLMEngine's step-by-step API, as vLLM users drive it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import LLM, EngineArgs, LLMEngine, RequestOutputKind, SamplingParams
from tests.engine_core.engine.conftest import (
    HFGreedy,
    assert_pool_whole,
    make_engine,
    run_to_completion,
)
from tests.engine_core.engine.test_metrics import counter

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "zu ba ki lo me"]


def greedy(max_tokens: int = 16, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):
    return make_engine(tiny_model_dir, max_num_batched_tokens=64, num_gpu_blocks_override=64)


def reference_texts(engine, max_tokens: int = 16) -> dict[str, str]:
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"ref{i}", p, greedy(max_tokens))
    return {k: v.outputs[0].text for k, v in run_to_completion(engine).items()}


def test_stop_string_spanning_tokens_cuts_text_and_frees_the_request(engine) -> None:
    full = reference_texts(engine)["ref1"]
    stop = full[5:9]  # very likely spans a token boundary; either way it must cut here
    assert stop and full.find(stop) == 5
    engine.add_request("s", PROMPTS[1], greedy(stop=[stop]))
    engine.add_request("s_incl", PROMPTS[1], greedy(stop=[stop], include_stop_str_in_output=True))
    out = run_to_completion(engine)
    assert out["s"].outputs[0].text == full[:5]
    assert out["s"].outputs[0].finish_reason == "stop"
    assert out["s"].outputs[0].stop_reason == stop
    assert out["s_incl"].outputs[0].text == full[:9]
    assert not engine.has_unfinished_requests()
    assert_pool_whole(engine)


def test_n2_returns_two_independent_samples_in_one_output(engine) -> None:
    engine.add_request("n2", PROMPTS[0], SamplingParams(n=2, temperature=1.0, seed=3,
                                                        max_tokens=12))
    out = run_to_completion(engine)["n2"]
    assert [c.index for c in out.outputs] == [0, 1]
    assert all(len(c.token_ids) == 12 for c in out.outputs)
    assert out.outputs[0].token_ids != out.outputs[1].token_ids
    assert_pool_whole(engine)


def test_delta_chunks_concatenate_to_the_cumulative_result(engine) -> None:
    engine.add_request("cum", PROMPTS[2], greedy(20))
    engine.add_request("delta", PROMPTS[2], greedy(20, output_kind=RequestOutputKind.DELTA))
    texts: list[str] = []
    tokens: list[int] = []
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "delta":
                texts.append(out.outputs[0].text)
                tokens.extend(out.outputs[0].token_ids)
            elif out.finished:
                final = out
    assert final is not None
    assert "".join(texts) == final.outputs[0].text
    assert tokens == final.outputs[0].token_ids


def test_abort_mid_stream_ends_the_request_and_frees_its_blocks(engine) -> None:
    engine.add_request("a", PROMPTS[0], greedy(200))
    engine.add_request("b", PROMPTS[1], greedy(8))
    for _ in range(3):
        engine.step()
    engine.abort_request("a")
    assert engine.get_num_unfinished_requests() == 1
    out = run_to_completion(engine)
    assert "a" not in out and out["b"].finished
    assert_pool_whole(engine)


def test_reset_with_running_requests_leaves_greedy_outputs_unchanged(engine) -> None:
    expected = reference_texts(engine, 24)
    assert engine.reset_prefix_cache()
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, greedy(24))
    engine.step()
    engine.step()
    # Blocks are in use: a plain reset must refuse and change nothing.
    assert engine.reset_prefix_cache() is False
    assert engine.reset_prefix_cache(reset_running_requests=True) is True
    assert engine.get_stats()["prefix_cache_hit_rate"] == 0.0
    out = run_to_completion(engine)
    assert {k.replace("r", "ref"): v.outputs[0].text for k, v in out.items()} == expected
    assert_pool_whole(engine)


def test_prompt_logprobs_equal_hf(engine, hf_greedy: HFGreedy) -> None:
    engine.add_request("lp", PROMPTS[1], greedy(2, prompt_logprobs=2, logprobs=1))
    out = run_to_completion(engine)["lp"]
    ids = out.prompt_token_ids
    with torch.inference_mode():
        logits = hf_greedy.model(torch.tensor([ids])).logits[0].float()
    ref = torch.log_softmax(logits, dim=-1)
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    for pos in range(1, len(ids)):
        entry = out.prompt_logprobs[pos]
        assert entry is not None and ids[pos] in entry
        assert entry[ids[pos]].logprob == pytest.approx(ref[pos - 1, ids[pos]].item(), abs=1e-4)
        top = torch.topk(ref[pos - 1], 2).indices.tolist()
        assert set(top) <= set(entry)
    sampled = out.outputs[0].logprobs
    assert sampled is not None and len(sampled) == 2
    assert sampled[0][out.outputs[0].token_ids[0]].rank == 1  # greedy takes the best token


INVALID = [
    ("n", {"n": 0}), ("temperature", {"temperature": 2.5}), ("top_p", {"top_p": 0.0}),
    ("top_k", {"top_k": -2}), ("min_p", {"min_p": 1.5}),
    ("presence_penalty", {"presence_penalty": 3.0}),
    ("frequency_penalty", {"frequency_penalty": -3.0}),
    ("repetition_penalty", {"repetition_penalty": 0.0}), ("max_tokens", {"max_tokens": 0}),
    ("min_tokens", {"min_tokens": 5, "max_tokens": 2}), ("logprobs", {"logprobs": -2}),
    ("prompt_logprobs", {"prompt_logprobs": -2}), ("stop", {"stop": [""]}),
    ("n", {"n": 2, "temperature": 0.0}),
]


@pytest.mark.parametrize(("field", "kwargs"), INVALID, ids=[f for f, _ in INVALID])
def test_invalid_sampling_params_raise_naming_the_field(field: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(("field", "prompt", "params"), [
    ("prompt", "", None),
    ("prompt_token_ids", {"prompt_token_ids": [1, 10**6]}, None),
    ("stop_token_ids", "hi", SamplingParams(stop_token_ids=[10**6])),
    ("max_model_len", {"prompt_token_ids": [5] * 5000}, None),
])
def test_invalid_requests_raise_and_leave_the_engine_unchanged(engine, field, prompt,
                                                               params) -> None:
    before = engine.get_num_unfinished_requests()
    with pytest.raises(ValueError, match=field):
        engine.add_request("bad", prompt, params)
    assert engine.get_num_unfinished_requests() == before
    engine.add_request("bad", "fine now", greedy(2))  # the id was not taken
    run_to_completion(engine)
    assert_pool_whole(engine)


def test_duplicate_and_non_str_request_ids_are_refused(engine) -> None:
    engine.add_request("dup", PROMPTS[0], greedy(4))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("dup", PROMPTS[1], greedy(4))
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request(7, PROMPTS[1], greedy(4))  # type: ignore[arg-type]
    assert engine.get_num_unfinished_requests() == 1
    run_to_completion(engine)


def test_offline_llm_generate_returns_outputs_in_prompt_order(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    outs = llm.generate(PROMPTS, greedy(6), use_tqdm=False)
    assert [o.prompt for o in outs] == PROMPTS
    assert all(o.finished and len(o.outputs[0].token_ids) == 6 for o in outs)


def test_offline_llm_chat_renders_each_conversation_with_the_template(
        tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    hi = [{"role": "user", "content": "kalo"}]
    bye = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "mi"}]
    outs = llm.chat([hi, bye], greedy(4), use_tqdm=False)
    template = llm.get_tokenizer().apply_chat_template
    assert [o.prompt for o in outs] == [template(hi, True), template(bye, True)]
    one = llm.chat(hi, greedy(4), use_tqdm=False, add_generation_prompt=False)[0]
    assert one.prompt == template(hi, False) != outs[0].prompt
    assert outs[0].outputs[0].token_ids == llm.generate(
        {"messages": hi}, greedy(4), use_tqdm=False)[0].outputs[0].token_ids


def test_offline_llm_chat_takes_tools_and_tool_calls_as_vllm_does(tiny_model_dir: Path) -> None:
    # OpenAI's arguments string reaches the template as an object (the tiny template writes a
    # call as "<|call|>NAME ARGUMENTS-JSON"); the tools reach it too.
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "kalo"},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "1", "type": "function", "function": {"name": "f", "arguments": '{"n": 3}'}}]},
        {"role": "tool", "content": "mi", "tool_call_id": "1"}]
    out = llm.chat(history, greedy(2), use_tqdm=False, tools=[
        {"type": "function", "function": {"name": "f"}}])[0]
    assert '<|assistant|>\n<|call|>f {"n": 3}<|end|>\n<|tool|>\nmi<|end|>' in (out.prompt or "")
    assert history[1]["tool_calls"][0]["function"]["arguments"] == '{"n": 3}'  # not changed
    bad: list[dict[str, Any]] = [history[0], {**history[1], "tool_calls": [{
        "id": "1", "type": "function", "function": {"name": "f", "arguments": "{n"}}]}]
    with pytest.raises(ValueError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments "
                                         "must be a JSON object"):
        llm.chat(bad, greedy(2), use_tqdm=False)


def test_offline_llm_generate_with_a_bad_prompt_adds_none_of_the_batch(
        tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="prompt_token_ids must be in"):
        llm.generate([PROMPTS[0], PROMPTS[1], {"prompt_token_ids": [10**6]}], greedy(4),
                     use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    assert not llm.engine.engine_core.scheduler.has_unfinished_requests()
    # Taken back, not aborted: they never ran.
    assert counter(llm.engine, "strand:request_success", finished_reason="abort") == 0
    # vLLM's skip_tokenizer_init case through LLM: a text prompt refused, token ids served.
    raw = LLM(str(tiny_model_dir), dtype="float32", device="cpu", skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="cannot pass text prompts when"):
        raw.generate("abc", use_tqdm=False)
    out = raw.generate({"prompt_token_ids": [1, 2, 3]}, greedy(4), use_tqdm=False)[0]
    assert out.outputs[0].text == "" and len(out.outputs[0].token_ids) == 4


def test_get_stats_reports_load_cache_and_throughput(tiny_model_dir: Path, caplog) -> None:
    engine = make_engine(tiny_model_dir, log_stats=True, stats_interval_s=0.0)
    engine.add_request("s0", PROMPTS[0], greedy(8))
    engine.add_request("s1", PROMPTS[0], greedy(8))
    with caplog.at_level("INFO", logger="strand.stats"):
        engine.step()
    # The first step's line counts the prompts it prefilled.
    assert not any("Avg prompt throughput: 0.0 tokens/s" in r.getMessage()
                   for r in caplog.records)
    caplog.clear()
    stats = engine.get_stats()
    assert stats["num_running_reqs"] == 2 and stats["num_waiting_reqs"] == 0
    assert 0.0 < stats["kv_cache_usage"] <= 1.0
    with caplog.at_level("INFO", logger="strand.stats"):
        run_to_completion(engine)
    assert engine.get_stats()["generation_tokens_per_s"] > 0.0
    assert engine.get_stats()["prefix_cache_hit_rate"] > 0.0  # s1 reused s0's full blocks
    assert any("generation throughput" in r.getMessage() for r in caplog.records)


def test_stepping_on_another_thread_than_the_load_warns_once(
        tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    # On CPU a second thread running torch makes libgomp stop spin-waiting in every step.
    import threading

    engine = LLMEngine.from_engine_args(EngineArgs(model=str(tiny_model_dir), device="cpu",
                                                   kv_cache_memory=8 * 1024**2))
    engine.add_request("a", {"prompt_token_ids": [1, 5, 6]},
                       SamplingParams(temperature=0.0, max_tokens=3))

    def steps() -> None:
        while engine.has_unfinished_requests():
            engine.step()

    with caplog.at_level("WARNING", logger="strand.engine_core.core.engine"):
        worker = threading.Thread(target=steps)
        worker.start()
        worker.join()
    warnings = [r for r in caplog.records if "other than the one that loaded" in r.message]
    assert len(warnings) == 1


def test_offline_llm_generate_takes_a_priority_per_prompt(tiny_model_dir: Path) -> None:
    # One request at a time: the lowest priority value is served first, as vLLM's LLM does.
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu",
              scheduling_policy="priority", max_num_seqs=1)
    outs = llm.generate(PROMPTS[:3], greedy(4), use_tqdm=False, priority=[5, 0, 1])
    assert [o.prompt for o in outs] == PROMPTS[:3]
    finished = [o.metrics.finished_time for o in outs if o.metrics is not None
                and o.metrics.finished_time is not None]
    assert len(finished) == 3 and finished[1] < finished[2] < finished[0]
    with pytest.raises(ValueError, match=r"priority must be one per prompt \(3\), got 1"):
        llm.generate(PROMPTS[:3], greedy(4), use_tqdm=False, priority=[0])
    fcfs = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="needs scheduling_policy 'priority'"):
        fcfs.generate(PROMPTS[:1], greedy(4), use_tqdm=False, priority=[2])


def test_the_tokenizer_loads_before_the_model_where_its_directory_has_one(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its load's temporaries are then freed into the heap the weights reuse, not added on top of
    # the loaded model at the process's peak. A directory without one loads the model first, so
    # that a model that cannot load still says so first.
    from strand.engine_core.core.engine import EngineCore
    from strand.engine_core.processing.tokenizer import Tokenizer

    order: list[str] = []
    real_core, real_tokenizer = EngineCore.from_engine_args, Tokenizer.from_dir

    def core(args: EngineArgs) -> EngineCore:
        order.append("model")
        return real_core(args)

    def tokenizer(cls: type[Tokenizer], path: Any, chat_template: str | None = None) -> Any:
        order.append("tokenizer")
        return real_tokenizer(path, chat_template)

    monkeypatch.setattr(EngineCore, "from_engine_args", staticmethod(core))
    monkeypatch.setattr(Tokenizer, "from_dir", classmethod(tokenizer))
    LLMEngine.from_engine_args(EngineArgs(model=str(tiny_model_dir), device="cpu",
                                          num_gpu_blocks_override=16))
    assert order == ["tokenizer", "model"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLMEngine.from_engine_args(EngineArgs(model=str(tmp_path / "missing"), device="cpu"))
