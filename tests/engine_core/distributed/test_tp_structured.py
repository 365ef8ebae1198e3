"""Structured outputs with tensor parallelism: the grammar bitmask is applied where rank 0
samples (the gathered full-vocabulary logits), so TP=2 gives TP=1's greedy tokens for every
kind of constraint in one batch, across preemption, and each output satisfies its constraint."""

from __future__ import annotations

from pathlib import Path

from strand.engine_core import LLMEngine, SamplingParams
from tests.engine_core.distributed.conftest import tp_engine
from tests.engine_core.engine.conftest import run_to_completion
from tests.engine_core.structured_output.constraints import assert_satisfies, constraint

MAX_TOKENS = 48  # every constraint used here ends well within this many tokens
# (request id, constraint, prompt): three JSON objects of ~40 tokens (11 blocks each) outgrow
# the pool together, so some are preempted and resume (rank 0 replays their output through a
# fresh matcher); the other kinds end within a few tokens.
REQUESTS = [("json-0", "json", [5, 6, 7, 8]), ("json-1", "json", [9, 10, 11, 12]),
            ("json-2", "json", [13, 14, 15, 16]), ("choice", "choice", [5, 6, 7, 8]),
            ("regex", "regex", [17, 18]), ("grammar", "grammar", [19, 20, 21])]
PRESSURE = {"block_size": 4, "num_gpu_blocks_override": 20, "max_num_seqs": 8}


def run(engine: LLMEngine) -> tuple[dict[str, list[int]], dict[str, str], int]:
    for request_id, kind, prompt in REQUESTS:
        engine.add_request(request_id, {"prompt_token_ids": prompt}, SamplingParams(
            max_tokens=MAX_TOKENS, temperature=0.0, structured_outputs=constraint(kind)))
    # An unconstrained neighbour: its row of the bitmask must stay free.
    engine.add_request("free", {"prompt_token_ids": [22, 23]},
                       SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    done = run_to_completion(engine)
    preemptions = engine.engine_core.scheduler.make_stats().num_preemptions
    return ({r: list(o.outputs[0].token_ids) for r, o in done.items()},
            {r: o.outputs[0].text for r, o in done.items()}, preemptions)


def test_tp2_structured_outputs_equal_tp1_and_satisfy_their_constraints(
        tiny_model_dir: Path) -> None:
    results = []
    for tp in (1, 2):
        with tp_engine(tiny_model_dir, tp, **PRESSURE) as engine:
            results.append(run(engine))
    (tokens1, _, preempted1), (tokens2, texts2, preempted2) = results
    assert preempted1 > 0 and preempted2 > 0, "the pool was too large to preempt anything"
    assert tokens2 == tokens1
    for request_id, kind, _ in REQUESTS:
        assert_satisfies(kind, texts2[request_id])
    assert len(tokens2["free"]) == 12
