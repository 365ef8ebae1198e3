"""A step that verifies drafts attends a token a row, so it runs on the decode paths (the fused
CPU step, decode graphs) and gives what decoding one token at a time gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from strand.engine_core.model_executor.model_runner import ModelRunner
from tests.engine_core.model_executor.conftest import (
    Blocks,
    count_fused_calls,
    make_runner,
    new_req,
    prompt,
    step,
)
from tests.engine_core.model_executor.test_decode_graphs import graph_runner

K = 3


def one_at_a_time(runner: ModelRunner, tokens: list[int], n: int) -> list[int]:
    """n greedy tokens after `tokens`, a decode step each."""
    blocks = Blocks(runner.block_size)
    out = runner.execute_model(step(new=[new_req("a", tokens, blocks.take(0, len(tokens)))],
                                    num_scheduled={"a": len(tokens)})).sampled_token_ids[0]
    length = len(tokens) + 1
    while len(out) < n:
        cached = [("a", blocks.take(length - 1, length), length - 1)]
        out += runner.execute_model(step(cached=cached,
                                         num_scheduled={"a": 1})).sampled_token_ids[0]
        length += 1
    return out


def verify(runner: ModelRunner, tokens: list[int], drafts: list[int]) -> list[int]:
    """Prefill `tokens`, then one step verifying `drafts` after the sampled token."""
    blocks = Blocks(runner.block_size)
    first = runner.execute_model(step(new=[new_req("b", tokens, blocks.take(0, len(tokens)))],
                                      num_scheduled={"b": len(tokens)})).sampled_token_ids[0]
    length = len(tokens) + 1
    so = step(cached=[("b", blocks.take(length - 1, length + len(drafts)), length - 1)],
              num_scheduled={"b": 1 + len(drafts)})
    so.scheduled_spec_decode_tokens = {"b": drafts}
    return first + runner.execute_model(so).sampled_token_ids[0]


@pytest.mark.parametrize("wrong_at", [None, 1])
def test_the_fused_cpu_step_verifies_drafts(llama_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                            wrong_at: int | None) -> None:
    tokens = prompt(3, 11)
    want = one_at_a_time(make_runner(llama_dir), tokens, K + 2)
    drafts = want[1:1 + K]
    if wrong_at is not None:
        drafts[wrong_at] = (drafts[wrong_at] + 1) % 512
    calls: list[str] = []
    count_fused_calls(monkeypatch, calls)
    got = verify(make_runner(llama_dir), tokens, drafts)
    assert calls, "the drafted step did not take the fused step"
    # All accepted: the drafts and one more; else up to the wrong one, then the model's token.
    assert got == (want[:K + 2] if wrong_at is None else want[:wrong_at + 2])


def test_decode_graphs_verify_drafts(llama_dir: Path) -> None:
    tokens = prompt(4, 9)
    eager = make_runner(llama_dir, attention_backend="triton", enforce_eager=True)
    want = one_at_a_time(eager, tokens, K + 2)
    runner, graphs = graph_runner(llama_dir)
    assert verify(runner, tokens, want[1:1 + K]) == want[:K + 2]
    assert graphs.replayed == [4]  # the drafted step's K + 1 rows, in the size-4 graph
