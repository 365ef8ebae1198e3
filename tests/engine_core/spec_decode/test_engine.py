"""Speculative decoding in the engine: greedy tokens are HF's, and every output is what the
same requests give without drafts, with chunked prefill, preemption, prefix hits, requests that
may not be drafted, stops inside a draft, aborts and the batch queue in the same runs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from strand.engine_core import LLMEngine, SamplingParams, StructuredOutputsParams
from strand.engine_core.outputs import RequestOutput, SampleLogprobs
from tests.engine_core.engine.conftest import HFGreedy, assert_pool_whole, make_engine
from tests.engine_core.engine.test_greedy_matches_hf import make_prompts
from tests.engine_core.engine.test_metrics import counter
from tests.engine_core.spec_decode.conftest import NGRAM, repetitive_prompts, run

MAX_TOKENS = 40


@pytest.fixture(scope="module")
def hf_greedy(tiny_model_dir: Path) -> HFGreedy:
    return HFGreedy(tiny_model_dir)


def test_greedy_equals_hf_with_drafts_chunking_preemption_and_prefix_hits(
        tiny_model_dir: Path, hf_greedy: HFGreedy) -> None:
    prompts = make_prompts(512) + repetitive_prompts(512)
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)] * len(prompts)
    finished, engine = run(tiny_model_dir, prompts, params, True, block_size=16,
                           num_gpu_blocks_override=24, max_num_batched_tokens=48, max_num_seqs=8)
    stats = engine.engine_core.scheduler.make_stats()
    assert stats.num_preemptions > 0, "the tiny pool should have forced preemption"
    assert stats.prefix_cache_stats.hits > 0, "shared prefixes should have hit the cache"
    spec = stats.spec_decoding
    assert spec is not None and spec.num_accepted_tokens >= 20, spec
    assert spec.num_draft_tokens > spec.num_accepted_tokens, "no draft was ever rejected"
    for i, prompt in enumerate(prompts):
        assert finished[str(i)].outputs[0].token_ids == hf_greedy.generate(prompt, MAX_TOKENS), i
    assert_pool_whole(engine)


def same_logprobs(a: SampleLogprobs | None, b: SampleLogprobs | None) -> bool:
    """The same tokens and ranks each step; values within float rounding (a batch of other
    shapes runs other kernels)."""
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(x[t].rank == y[t].rank
                                     and abs(x[t].logprob - y[t].logprob) < 1e-4 for t in x)
        for x, y in zip(a, b, strict=True))


def mixed_params(stop_token: int) -> list[SamplingParams]:
    """One of each kind of request beside the plain greedy ones."""
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return [
        greedy,
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2),  # a row a token
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, presence_penalty=0.7),
        # Stopped inside a draft: its logprobs end with the stop token too.
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=[stop_token],
                       logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=7),  # the draft is cut at max_tokens
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, min_tokens=12,
                       stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logit_bias={7: 1.5}),
        greedy,
    ]


@pytest.mark.parametrize("engine_args", [
    {},
    {"max_concurrent_batches": 2},  # the batch queue: step N + 1 scheduled while N computes
    {"num_gpu_blocks_override": 14, "block_size": 8, "max_num_batched_tokens": 24},
], ids=["plain", "batch_queue", "tight_pool"])
def test_every_output_equals_the_run_without_drafts(tiny_model_dir: Path,
                                                    engine_args: dict[str, int]) -> None:
    p = repetitive_prompts(512)
    prompts = [p[0], p[1], p[2], p[3], p[0], p[3], p[1], p[2]]
    base, _ = run(tiny_model_dir, p[3:], [SamplingParams(temperature=0.0)], False)
    # A token prompt 3's greedy output holds after a few tokens: a stop inside a draft (for
    # request 3), and banned by min_tokens where it first comes (request 5).
    stop_token = base["0"].outputs[0].token_ids[5]
    params = mixed_params(stop_token)
    want, _ = run(tiny_model_dir, prompts, params, False, **engine_args)
    got, engine = run(tiny_model_dir, prompts, params, True, **engine_args)
    spec = engine.engine_core.scheduler.make_stats().spec_decoding
    assert spec is not None and spec.num_accepted_tokens > 0
    for req_id, out in want.items():
        a, b = got[req_id].outputs[0], out.outputs[0]
        assert (a.token_ids, a.finish_reason, a.stop_reason) == \
            (b.token_ids, b.finish_reason, b.stop_reason), req_id
        assert same_logprobs(a.logprobs, b.logprobs), req_id
    assert got["3"].outputs[0].finish_reason == "stop"
    assert len(got["4"].outputs[0].token_ids) == 7
    assert_pool_whole(engine)


def test_requests_that_may_not_be_drafted_never_are(tiny_model_dir: Path) -> None:
    """A grammar's matcher would have to walk the drafts: such requests decode a token a step."""
    prompts = repetitive_prompts(512)
    grammar = StructuredOutputsParams(regex="[a-z ]{1,60}")
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=grammar)
              ] * len(prompts)
    _, engine = run(tiny_model_dir, prompts, params, True)
    spec = engine.engine_core.scheduler.make_stats().spec_decoding
    assert spec is not None and spec.num_drafts == 0


def drafted_ids(engine: LLMEngine, after_step: Callable[[dict[str, int]], None] | None = None
                ) -> tuple[dict[str, RequestOutput], dict[str, int]]:
    """Step to the end; each request's output and how many of its draft tokens were verified
    (after_step sees those counts after each step)."""
    finished: dict[str, RequestOutput] = {}
    verified: dict[str, int] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                finished[out.request_id] = out
        last = engine.engine_core.last_scheduler_output
        for req_id, drafts in (last.scheduled_spec_decode_tokens if last else {}).items():
            verified[req_id] = verified.get(req_id, 0) + len(drafts)
        if after_step is not None:
            after_step(verified)
    return finished, verified


def test_penalties_bad_words_and_min_tokens_are_drafted_and_unchanged(
        tiny_model_dir: Path) -> None:
    """Each draft row is processed with the drafts before it in the output: the penalties,
    the bad-word bans and min_tokens' EOS ban see what one-at-a-time decoding would see."""
    p = repetitive_prompts(512)
    base, _ = run(tiny_model_dir, p, [SamplingParams(temperature=0.0, max_tokens=12)] * 4,
                  False)
    looped = base["1"].outputs[0].token_ids  # a token its greedy answer repeats: banned below
    params = [
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, presence_penalty=0.6,
                       frequency_penalty=0.4),
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                       bad_words_token_ids=[[looped[3]], [looped[4], looped[5]]]),
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, min_tokens=30,
                       stop_token_ids=[looped[6]]),
        SamplingParams(temperature=0.9, top_k=8, seed=5, max_tokens=MAX_TOKENS,
                       repetition_penalty=1.2),
    ]
    prompts = [p[0], p[1], p[1], p[2], p[3]]
    want, _ = run(tiny_model_dir, prompts, params[:4] + [params[4]], False)
    engine = make_engine(tiny_model_dir, speculative_config=NGRAM)
    for i, (prompt, sampling) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, sampling)
    got, verified = drafted_ids(engine)
    for req_id in ("0", "1", "2", "3"):  # greedy: the very tokens of the run without drafts
        assert verified.get(req_id, 0) > 0, f"request {req_id} was never drafted"
        a, b = got[req_id].outputs[0], want[req_id].outputs[0]
        assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason), req_id
    spec = engine.engine_core.scheduler.make_stats().spec_decoding
    assert spec is not None and spec.num_accepted_tokens > 0
    assert_pool_whole(engine)


def test_an_abort_between_drafted_steps_frees_everything(tiny_model_dir: Path) -> None:
    prompts = repetitive_prompts(512)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    want, _ = run(tiny_model_dir, prompts, [params] * len(prompts), False)
    engine = make_engine(tiny_model_dir, speculative_config=NGRAM)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    aborted: list[bool] = []

    def abort_once_drafted(verified: dict[str, int]) -> None:
        if not aborted and verified.get("1"):
            engine.abort_request(["1"])
            aborted.append(True)

    finished, _ = drafted_ids(engine, abort_once_drafted)
    assert aborted, "request 1 was never drafted"
    assert "1" not in finished or finished["1"].outputs[0].finish_reason == "abort"
    for req_id in ("0", "2", "3"):
        assert finished[req_id].outputs[0].token_ids == want[req_id].outputs[0].token_ids
    assert_pool_whole(engine)


def test_random_sampling_with_drafts_is_seeded_and_bounded(tiny_model_dir: Path) -> None:
    prompts = repetitive_prompts(512)
    params = [SamplingParams(temperature=0.3, top_k=4, seed=40 + i, max_tokens=30,
                             ignore_eos=True) for i in range(len(prompts))]
    runs = [run(tiny_model_dir, prompts, params, True) for _ in range(2)]
    for finished, engine in runs:
        assert all(len(out.outputs[0].token_ids) == 30 for out in finished.values())
        spec = engine.engine_core.scheduler.make_stats().spec_decoding
        assert spec is not None and spec.num_accepted_tokens > 0
        assert_pool_whole(engine)
    first, second = (runs[0][0], runs[1][0])
    assert {k: v.outputs[0].token_ids for k, v in first.items()} == \
        {k: v.outputs[0].token_ids for k, v in second.items()}


def test_acceptance_is_counted_in_metrics_and_the_stats_line(
        tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    prompts = repetitive_prompts(512)
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)] * len(prompts)
    _, engine = run(tiny_model_dir, prompts, params, True, log_stats=True)
    spec = engine.engine_core.scheduler.make_stats().spec_decoding
    assert spec is not None and spec.num_accepted_tokens > 0
    assert counter(engine, "strand:spec_decode_num_drafts") == spec.num_drafts
    assert counter(engine, "strand:spec_decode_num_draft_tokens") == spec.num_draft_tokens
    assert counter(engine, "strand:spec_decode_num_accepted_tokens") == spec.num_accepted_tokens
    assert counter(engine, "strand:spec_decode_num_accepted_tokens_per_pos",
                   position="0") == spec.accepted_per_pos[0]
    assert sum(spec.accepted_per_pos) == spec.num_accepted_tokens
    with caplog.at_level(logging.INFO):
        engine.do_log_stats()
    mean = 1 + spec.num_accepted_tokens / spec.num_drafts
    assert f"Spec decode: mean acceptance length {mean:.2f}, accepted " \
           f"{spec.num_accepted_tokens} of {spec.num_draft_tokens} draft tokens" in caplog.text


def test_no_drafts_while_the_batch_is_past_disable_by_batch_size(tiny_model_dir: Path) -> None:
    prompts = repetitive_prompts(512)  # four requests; two end early, then two run on
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in (6, 8, 40, 40)]
    want, _ = run(tiny_model_dir, prompts, params, False)
    engine = make_engine(tiny_model_dir, speculative_config={**NGRAM,
                                                             "disable_by_batch_size": 2})
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, p)
    finished = {}
    drafted_with = []  # running requests at each step that drafted
    while engine.has_unfinished_requests():
        running = len(engine.engine_core.scheduler.running)
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                finished[out.request_id] = out
        last = engine.engine_core.last_scheduler_output
        if last is not None and last.scheduled_spec_decode_tokens:
            drafted_with.append(running)
    assert drafted_with, "nothing drafted once the batch shrank"
    assert max(drafted_with) <= 2
    for req_id, out in want.items():
        assert finished[req_id].outputs[0].token_ids == out.outputs[0].token_ids
