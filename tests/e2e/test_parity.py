"""The seed loop reads the same through the gateway as in process, with identical greedy outputs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from strand.engine_core.config import EngineArgs
from strand.engine_core.llm_engine import LLMEngine
from strand.engine_core.outputs import PoolingRequestOutput, RequestOutput
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.services.client import EngineClient
from strand.services.demo import run_seed_loop
from strand.services.launch import Stack
from tests.e2e.conftest import ENGINE_FLAGS, start_stack


def _summary(outputs: Sequence[RequestOutput | PoolingRequestOutput]) -> list[tuple]:
    return [(o.request_id, o.prompt, o.prompt_token_ids, o.finished,
             [(c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs])
            for o in outputs if isinstance(o, RequestOutput)]


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


@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY])
def test_n_greater_than_one_gives_n_seeded_samples(in_process: LLMEngine, client: EngineClient,
                                                   kind: RequestOutputKind) -> None:
    params = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=5, output_kind=kind)
    results = {}
    for name, engine in (("local", in_process), ("remote", client)):
        engine.add_request("n2", "sample me", params)
        final = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                assert isinstance(out, RequestOutput)  # a generating engine's
                final = out
        results[name] = final
    assert results["remote"] is not None and results["local"] is not None
    assert len(results["remote"].outputs) == 2
    assert _summary([results["remote"]]) == _summary([results["local"]])


def _steps_until_done(engine: LLMEngine | EngineClient, abort_at: dict[int, str] | None = None
                      ) -> list[list[tuple]]:
    """Every step's outputs, summarised; abort_at: step number -> request id to abort then."""
    per_step = []
    step = 0
    while engine.has_unfinished_requests():
        per_step.append(_summary(engine.step()))
        step += 1
        if abort_at and step in abort_at:
            engine.abort_request([abort_at[step]])
    return per_step


def test_stop_strings_and_an_abort_mid_stream_match_step_for_step(
        in_process: LLMEngine, client: EngineClient) -> None:
    # A stop string taken from the model's own greedy text, so it is sure to occur mid-output.
    probe = SamplingParams(temperature=0.0, max_tokens=12)
    in_process.add_request("probe", "stop strings here", probe)
    text = _steps_until_done(in_process)[-1][0][4][0][1]
    stop = text[3:5]
    assert len(stop) == 2, text
    Case = tuple[str, str | dict[str, Any], SamplingParams]
    cases: list[Case] = [
        ("st", "stop strings here", SamplingParams(temperature=0.0, max_tokens=12, stop=[stop])),
        ("ab", "this one is aborted", SamplingParams(temperature=0.0, max_tokens=12)),
        ("ok", {"prompt_token_ids": [1, 50, 51, 52]},
         SamplingParams(temperature=0.0, max_tokens=6, output_kind=RequestOutputKind.DELTA)),
        # Held in the engine stage between its first and last output; aborted meanwhile.
        ("fa", "this one is held, then aborted",
         SamplingParams(temperature=0.0, max_tokens=12, output_kind=RequestOutputKind.FINAL_ONLY)),
        ("fo", "this one is held to the end",
         SamplingParams(temperature=0.0, max_tokens=9, output_kind=RequestOutputKind.FINAL_ONLY)),
    ]
    runs = {}
    for name, engine in (("local", in_process), ("remote", client)):
        for request_id, prompt, params in cases:
            engine.add_request(request_id, prompt, params)
        runs[name] = _steps_until_done(engine, abort_at={2: "ab", 4: "fa"})
    assert runs["remote"] == runs["local"]
    finals = {o[0]: o for step in runs["local"] for o in step if o[3]}
    assert finals["st"][4][0][3:] == ("stop", stop)
    assert "ab" not in finals  # LLMEngine.abort_request: no output after the abort
    assert finals["ok"][4][0][3] == "length"
    assert "fa" not in finals and len(finals["fo"][4][0][2]) == 9


# Small enough that three requests of 40 prompt + 24 new tokens cannot all stay resident.
PREEMPT_FLAGS = ["--block-size", "16", "--num-gpu-blocks-override", "9",
                 "--max-num-batched-tokens", "32"]


@pytest.fixture(scope="module")
def preempting_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[Stack]:
    with start_stack(tiny_model_dir, tmp_path_factory.mktemp("preempt-logs"),
                     ["--self-step-after", "3600"], engine_args=PREEMPT_FLAGS) as s:
        yield s


# FINAL_ONLY: the engine stage holds the tokens between the first and the last output
# (strand/services/engine/final_only_hold.py), across the preemptions too.
@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY])
def test_preemption_under_kv_pressure_matches_step_for_step(
        tiny_model_dir: Path, preempting_stack: Stack, kind: RequestOutputKind) -> None:
    import torch

    torch.set_num_threads(1)
    local = LLMEngine.from_engine_args(EngineArgs(
        model=str(tiny_model_dir), max_num_seqs=int(ENGINE_FLAGS[1]), block_size=16,
        num_gpu_blocks_override=9, max_num_batched_tokens=32))
    params = SamplingParams(temperature=0.0, max_tokens=24, output_kind=kind)
    prompts = [{"prompt_token_ids": [1 + i, *range(100 + 40 * i, 139 + 40 * i)]}
               for i in range(3)]
    runs = {}
    with EngineClient(preempting_stack.gateway_address, timeout=60) as remote:
        assert remote.reset_prefix_cache()  # an earlier case's blocks would be hits here only
        for name, engine in (("local", local), ("remote", remote)):
            for i, prompt in enumerate(prompts):
                engine.add_request(f"p{i}", prompt, params)
            runs[name] = _steps_until_done(engine)
    assert local.engine_core.scheduler.make_stats().num_preemptions > 0
    assert runs["remote"] == runs["local"]
    finished = [o for step in runs["local"] for o in step if o[3]]
    assert sorted(o[0] for o in finished) == ["p0", "p1", "p2"]
    assert all(len(o[4][0][2]) == 24 for o in finished)
