"""What the runner hands the sampler and returns: seeded generators, logprobs, prompt logprobs."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.engine_core.model_executor.conftest import (
    Blocks,
    hf_logits,
    make_runner,
    new_req,
    prompt,
    step,
)


def _generate(runner, blocks, req_id, tokens, num_steps, preempt_at=None, **params):
    out = runner.execute_model(step(new=[new_req(req_id, tokens, blocks.take(0, len(tokens)),
                                                 **params)],
                                    num_scheduled={req_id: len(tokens)}))
    generated = list(out.sampled_token_ids[0])
    for i in range(num_steps - 1):
        n = len(tokens) + len(generated)
        if i == preempt_at:
            runner.execute_model(step(preempted=[req_id]))
            resumed = new_req(req_id, tokens, blocks.take(0, n), output=generated, **params)
            out = runner.execute_model(step(new=[resumed], num_scheduled={req_id: n}))
        else:
            out = runner.execute_model(step(cached=[(req_id, blocks.take(n - 1, n), n - 1)],
                                            num_scheduled={req_id: 1}))
        generated += out.sampled_token_ids[0]
    return generated


def test_seeded_sampling_is_reproducible_across_runners(llama_dir: Path) -> None:
    tokens = prompt(40, 6)
    runs = [_generate(make_runner(llama_dir), Blocks(4), "a", tokens, 8, temperature=1.0,
                      seed=1234) for _ in range(2)]
    assert runs[0] == runs[1]
    other = _generate(make_runner(llama_dir), Blocks(4), "a", tokens, 8, temperature=1.0,
                      seed=99)
    assert other != runs[0]


def test_seeded_sampling_continues_its_stream_after_preemption(llama_dir: Path) -> None:
    tokens = prompt(41, 6)
    plain = _generate(make_runner(llama_dir), Blocks(4), "a", tokens, 8, temperature=1.0,
                      seed=7)
    preempted = _generate(make_runner(llama_dir), Blocks(4), "a", tokens, 8, preempt_at=3,
                          temperature=1.0, seed=7)
    assert preempted == plain


def test_sample_logprobs_rows_align_with_req_ids_and_skip_partial_chunks(
        llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    blocks = Blocks(runner.block_size)
    a, b = prompt(42, 10), prompt(43, 5)
    out = runner.execute_model(step(new=[new_req("a", a, blocks.take(0, 4)),
                                         new_req("b", b, blocks.take(0, 5), logprobs=3)],
                                    num_scheduled={"a": 4, "b": 5}))
    assert out.logprobs is not None
    assert out.logprobs.logprob_token_ids[0] == []  # a: partial chunk, nothing sampled
    row = out.logprobs.logprob_token_ids[1]
    assert len(row) == 4 and row[0] == out.sampled_token_ids[1][0]
    ref = torch.log_softmax(hf_logits(llama_dir, b)[-1], dim=-1)
    assert row[1:] == ref.topk(3).indices.tolist()
    torch.testing.assert_close(torch.tensor(out.logprobs.logprobs[1]), ref[row],
                               rtol=1e-4, atol=1e-5)
    assert out.logprobs.sampled_token_ranks[1] == 1  # greedy picks the best


def test_no_logprobs_when_no_request_asks(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    out = runner.execute_model(step(new=[new_req("a", prompt(44, 5), [1, 2])],
                                    num_scheduled={"a": 5}))
    assert out.logprobs is None and out.prompt_logprobs_dict == {}


def test_prompt_logprobs_cover_each_prompt_token_once_across_chunks(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    blocks = Blocks(runner.block_size)
    tokens = prompt(45, 11)
    first = runner.execute_model(step(new=[new_req("a", tokens, blocks.take(0, 6),
                                                   prompt_logprobs=2)],
                                      num_scheduled={"a": 6}))
    second = runner.execute_model(step(cached=[("a", blocks.take(6, 11), 6)],
                                       num_scheduled={"a": 5}))
    rows_1, rows_2 = first.prompt_logprobs_dict["a"], second.prompt_logprobs_dict["a"]
    assert rows_1 is not None and rows_2 is not None
    # Positions 0..5 score tokens 1..6; positions 6..9 score tokens 7..10; the last position
    # scores the first output token, which is not a prompt logprob.
    ids = [r[0] for r in rows_1.logprob_token_ids + rows_2.logprob_token_ids]
    assert ids == tokens[1:]
    ref = torch.log_softmax(hf_logits(llama_dir, tokens)[:-1], dim=-1)
    expected = ref.gather(1, torch.tensor(tokens[1:]).unsqueeze(1)).squeeze(1)
    got = torch.tensor([r[0] for r in rows_1.logprobs + rows_2.logprobs])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert all(len(r) == 3 for r in rows_1.logprob_token_ids)


def test_resumed_request_does_not_resend_prompt_logprobs(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    blocks = Blocks(runner.block_size)
    tokens = prompt(46, 5)
    out = runner.execute_model(step(new=[new_req("a", tokens, blocks.take(0, 5),
                                                 prompt_logprobs=1)],
                                    num_scheduled={"a": 5}))
    runner.execute_model(step(preempted=["a"]))
    resumed = new_req("a", tokens, blocks.take(0, 6), output=out.sampled_token_ids[0],
                      prompt_logprobs=1)
    again = runner.execute_model(step(new=[resumed], num_scheduled={"a": 6}))
    assert "a" not in again.prompt_logprobs_dict


def test_min_tokens_uses_the_models_eos_when_the_request_names_none(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    runner.execute_model(step(new=[new_req("a", prompt(47, 4), [1], min_tokens=2)],
                              num_scheduled={"a": 4}))
    assert runner.requests["a"].eos_token_id == 2  # the tiny model's </s>


def test_the_requests_own_eos_wins_over_the_models(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    req = new_req("a", prompt(48, 4), [1], min_tokens=2)
    req.eos_token_id = 7
    runner.execute_model(step(new=[req], num_scheduled={"a": 4}))
    assert runner.requests["a"].eos_token_id == 7
