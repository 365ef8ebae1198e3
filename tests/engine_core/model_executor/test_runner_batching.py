"""The runner is correct for mixed batches: chunked prefill, decodes, prefix hits, preemption."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine_core.model_executor.conftest import (
    Blocks,
    LogitsSpy,
    hf_logits,
    make_runner,
    max_rel_err,
    new_req,
    prompt,
    step,
)

TOL = 1e-4


def test_mixed_batch_of_prefill_chunks_and_decodes_matches_hf(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    spy = LogitsSpy(runner)
    blocks = Blocks(runner.block_size)
    a, b = prompt(10, 30), prompt(11, 9)
    # Step 1: a's first chunk (12 of 30 tokens) and all of b.
    out = runner.execute_model(step(new=[new_req("a", a, blocks.take(0, 12)),
                                         new_req("b", b, blocks.take(0, 9))],
                                    num_scheduled={"a": 12, "b": 9}))
    assert out.req_ids == ["a", "b"]
    assert out.sampled_token_ids[0] == []  # a partial chunk samples nothing
    b_tokens = b + out.sampled_token_ids[1]
    assert max_rel_err(spy.last[0], hf_logits(llama_dir, b)[-1]) < TOL
    # Step 2: b decodes while a finishes its prompt; the scheduler lists b first.
    out = runner.execute_model(step(cached=[("b", blocks.take(9, 10), 9),
                                            ("a", blocks.take(12, 30), 12)],
                                    num_scheduled={"b": 1, "a": 18}))
    assert out.req_id_to_index == {"b": 0, "a": 1}
    assert max_rel_err(spy.last[0], hf_logits(llama_dir, b_tokens)[-1]) < TOL
    assert max_rel_err(spy.last[1], hf_logits(llama_dir, a)[-1]) < TOL
    assert out.sampled_token_ids[1] == [int(hf_logits(llama_dir, a)[-1].argmax())]


def test_prefix_cache_hit_reuses_blocks_written_by_another_request(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    spy = LogitsSpy(runner)
    blocks = Blocks(runner.block_size)
    shared = prompt(20, 8)  # two full blocks of 4
    first = shared + prompt(21, 5)
    first_blocks = blocks.take(0, 13)
    runner.execute_model(step(new=[new_req("a", first, first_blocks)], num_scheduled={"a": 13}))
    second = shared + prompt(22, 6)
    # The scheduler found the two shared blocks cached: only the rest is computed.
    hit_blocks = first_blocks[:2] + blocks.take(8, 14)
    out = runner.execute_model(step(new=[new_req("b", second, hit_blocks, num_computed=8)],
                                    num_scheduled={"b": 6}, finished=["a"]))
    ref = hf_logits(llama_dir, second)[-1]
    assert max_rel_err(spy.last[0], ref) < TOL
    assert out.sampled_token_ids == [[int(ref.argmax())]]


def test_preempted_request_resumes_from_its_tokens_with_the_same_logits(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    spy = LogitsSpy(runner)
    blocks = Blocks(runner.block_size)
    tokens = prompt(30, 7)
    out = runner.execute_model(step(new=[new_req("a", tokens, blocks.take(0, 7))],
                                    num_scheduled={"a": 7}))
    generated = out.sampled_token_ids[0]
    n = 8
    out = runner.execute_model(step(cached=[("a", blocks.take(7, 8), 7)], num_scheduled={"a": 1}))
    generated += out.sampled_token_ids[0]
    # Preempted (blocks freed), then resent as new with its output so far, recomputed from 0.
    n = len(tokens) + len(generated)
    resumed = new_req("a", tokens, blocks.take(0, n), output=generated)
    runner.execute_model(step(preempted=["a"]))
    assert "a" not in runner.requests
    out = runner.execute_model(step(new=[resumed], num_scheduled={"a": n}))
    ref = hf_logits(llama_dir, tokens + generated)[-1]
    assert max_rel_err(spy.last[0], ref) < TOL
    assert out.sampled_token_ids == [[int(ref.argmax())]]
    assert runner.requests["a"].output_token_ids == generated + out.sampled_token_ids[0]


def test_finished_requests_are_dropped_and_their_rows_reused(llama_dir: Path) -> None:
    runner = make_runner(llama_dir, max_num_seqs=1)
    blocks = Blocks(runner.block_size)
    for i in range(3):  # more requests over time than rows: rows must be recycled
        req_id = f"r{i}"
        finished = [f"r{i - 1}"] if i else []
        runner.execute_model(step(new=[new_req(req_id, prompt(i, 5), blocks.take(0, 5))],
                                  num_scheduled={req_id: 5}, finished=finished))
        assert list(runner.requests) == [req_id]
        assert runner.requests[req_id].row == 0


def test_more_running_requests_than_max_num_seqs_grow_the_batch(llama_dir: Path) -> None:
    runner = make_runner(llama_dir, max_num_seqs=1)
    blocks = Blocks(runner.block_size)
    reqs = [new_req(f"r{i}", prompt(i, 3), blocks.take(0, 3)) for i in range(3)]
    out = runner.execute_model(step(new=reqs, num_scheduled={f"r{i}": 3 for i in range(3)}))
    assert all(len(t) == 1 for t in out.sampled_token_ids)


def test_cached_request_the_runner_never_saw_is_an_error(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    with pytest.raises(RuntimeError, match="'ghost'"):
        runner.execute_model(step(cached=[("ghost", [], 3)], num_scheduled={"ghost": 1}))


def test_scheduling_past_the_known_tokens_is_an_error(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    with pytest.raises(ValueError, match="must be <= its known tokens"):
        runner.execute_model(step(new=[new_req("a", [5, 6, 7], [1, 2])],
                                  num_scheduled={"a": 4}))


def test_too_few_blocks_for_the_scheduled_tokens_is_an_error(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    with pytest.raises(ValueError, match="more KV blocks"):
        runner.execute_model(step(new=[new_req("a", prompt(0, 9), [1, 2])],
                                  num_scheduled={"a": 9}))


def test_empty_step_returns_empty_output_and_still_drops_finished(llama_dir: Path) -> None:
    runner = make_runner(llama_dir)
    runner.execute_model(step(new=[new_req("a", [5, 6], [1])], num_scheduled={"a": 2}))
    out = runner.execute_model(step(finished=["a"]))
    assert out.req_ids == [] and out.sampled_token_ids == []
    assert runner.requests == {}
