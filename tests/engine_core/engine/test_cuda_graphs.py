"""--enforce-eager through the whole engine: it reaches the runner, and on CUDA the decode
graphs it turns off give the same greedy text as running eagerly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from strand.engine_core import LLMEngine, SamplingParams
from tests.engine_core.engine.conftest import make_engine, run_to_completion

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "zu ba ki lo me",
           "one two three", "a b c d e f g"]


def greedy_token_ids(engine: LLMEngine, num_prompts: int) -> list[list[int]]:
    for i, text in enumerate(PROMPTS[:num_prompts]):
        engine.add_request(f"p{i}", text, SamplingParams(temperature=0.0, max_tokens=24,
                                                         ignore_eos=True))
    out = run_to_completion(engine)
    return [list(out[f"p{i}"].outputs[0].token_ids) for i in range(num_prompts)]


def test_enforce_eager_reaches_the_model_runner(tiny_model_dir: Path) -> None:
    runner = make_engine(tiny_model_dir, enforce_eager=True).engine_core.runner
    assert runner.enforce_eager and runner.decode_graphs is None


def test_cpu_engine_runs_eagerly_by_default(tiny_model_dir: Path) -> None:
    runner = make_engine(tiny_model_dir).engine_core.runner
    assert not runner.enforce_eager and runner.decode_graphs is None


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="captures real CUDA graphs: needs a CUDA device")
@pytest.mark.parametrize("num_prompts", [3, 5])
def test_cuda_decode_graphs_give_the_greedy_tokens_of_enforce_eager(tiny_model_dir: Path,
                                                                    num_prompts: int) -> None:
    args = {"device": "cuda", "max_num_seqs": 8, "num_gpu_blocks_override": 256}
    graph = make_engine(tiny_model_dir, **args)
    decode_graphs = graph.engine_core.runner.decode_graphs
    assert decode_graphs is not None and sorted(decode_graphs.graphs) == [1, 2, 4, 8]
    eager = make_engine(tiny_model_dir, enforce_eager=True, **args)
    assert greedy_token_ids(graph, num_prompts) == greedy_token_ids(eager, num_prompts)
