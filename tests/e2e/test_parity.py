"""The seed loop reads the same through the gateway as in process, with identical greedy outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_core.config import EngineArgs
from engine_core.llm_engine import LLMEngine
from engine_core.outputs import RequestOutput
from engine_core.sampling_params import SamplingParams
from services.client import EngineClient
from services.demo import run_seed_loop
from tests.e2e.conftest import ENGINE_FLAGS


def _summary(outputs: list[RequestOutput]) -> list[tuple]:
    return [(o.request_id, o.prompt, o.prompt_token_ids, o.finished,
             [(c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs])
            for o in outputs]


@pytest.fixture(scope="module")
def in_process(tiny_model_dir: Path) -> LLMEngine:
    import torch

    torch.set_num_threads(1)
    args = EngineArgs(model=str(tiny_model_dir), max_num_seqs=int(ENGINE_FLAGS[1]),
                      kv_cache_memory=int(ENGINE_FLAGS[3]))
    return LLMEngine.from_engine_args(args)


def test_seed_loop_matches_llm_engine(in_process: LLMEngine, client: EngineClient) -> None:
    expected, expected_reset = run_seed_loop(in_process)
    got, got_reset = run_seed_loop(client)
    assert _summary(got) == _summary(expected)
    assert got_reset is True and expected_reset is True  # running requests were preempted
    assert len(got) == 5


def test_step_returns_the_outputs_of_each_iteration(in_process: LLMEngine,
                                                    client: EngineClient) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4)
    per_step: dict[str, list[list[tuple]]] = {"local": [], "remote": []}
    for name, engine in (("local", in_process), ("remote", client)):
        engine.add_request("s0", "one two three", params)
        engine.add_request("s1", {"prompt_token_ids": [1, 40, 41, 42, 43]}, params)
        while engine.has_unfinished_requests():
            per_step[name].append(_summary(engine.step()))
    assert per_step["remote"] == per_step["local"]
    assert len(per_step["local"]) == 4


def test_n_greater_than_one_gives_n_seeded_samples(in_process: LLMEngine,
                                                   client: EngineClient) -> None:
    params = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=5)
    results = {}
    for name, engine in (("local", in_process), ("remote", client)):
        engine.add_request("n2", "sample me", params)
        final = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                final = out
        results[name] = final
    assert results["remote"] is not None and results["local"] is not None
    assert len(results["remote"].outputs) == 2
    assert _summary([results["remote"]]) == _summary([results["local"]])
