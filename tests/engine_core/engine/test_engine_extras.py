"""LLMEngine's extras: supported tasks, collective_rpc, apply_model, profiling, tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from strand.engine_core import SamplingParams
from strand.engine_core.sleep_mode import EngineSleepingError
from tests.engine_core.engine.conftest import make_engine, run_to_completion


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):
    return make_engine(tiny_model_dir)


def test_supported_tasks_is_generate(engine) -> None:
    assert engine.get_supported_tasks() == ("generate",)


def test_collective_rpc_returns_one_result_per_worker(engine) -> None:
    devices = engine.collective_rpc(lambda worker: str(worker.device))
    assert devices == ["cpu"]
    sizes = engine.collective_rpc("__sizeof__")  # a method name, called on each worker
    assert len(sizes) == 1 and sizes[0] > 0
    with pytest.raises(ValueError, match="method"):
        engine.collective_rpc("no_such_method")


def test_apply_model_sees_the_loaded_weights(engine) -> None:
    counts = engine.apply_model(lambda model: sum(p.numel() for p in model.parameters()))
    assert len(counts) == 1 and counts[0] > 0
    dtypes = engine.apply_model(lambda model: next(model.parameters()).dtype)
    assert dtypes == [torch.float32]


def test_profile_writes_a_chrome_trace(engine, tmp_path: Path) -> None:
    engine.engine_core.profiler.trace_dir = str(tmp_path)
    engine.start_profile()
    engine.add_request("p", "hello world", SamplingParams(max_tokens=2, temperature=0.0))
    run_to_completion(engine)
    path = Path(engine.stop_profile())
    assert path.parent == tmp_path and path.exists()
    assert json.loads(path.read_text())["traceEvents"]
    with pytest.raises(ValueError, match="not running"):
        engine.stop_profile()


def test_profile_without_a_directory_is_refused(engine) -> None:
    engine.engine_core.profiler.trace_dir = ""
    with pytest.raises(ValueError, match="STRAND_TORCH_PROFILER_DIR"):
        engine.start_profile()


def test_tokenizer_property_and_getter_agree(engine) -> None:
    assert engine.get_tokenizer() is engine.tokenizer
    ids = engine.get_tokenizer().encode("hello")
    assert ids and all(isinstance(i, int) for i in ids)


def _greedy_text(engine, rid: str) -> list[int]:
    engine.add_request(rid, "the quick brown fox", SamplingParams(max_tokens=8, temperature=0.0))
    return list(run_to_completion(engine)[rid].outputs[0].token_ids)


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_kv_refuses_requests_and_wakes_to_the_same_output(
        tiny_model_dir: Path, level: int) -> None:
    engine = make_engine(tiny_model_dir)
    before = _greedy_text(engine, "a")
    engine.sleep(level=level)
    assert engine.is_sleeping()
    assert engine.engine_core.runner.kv_caches == []
    with pytest.raises(EngineSleepingError, match="wake_up"):
        engine.add_request("b", "hi", SamplingParams(max_tokens=2))
    engine.wake_up(tags=["weights"])
    assert engine.is_sleeping()  # the KV cache is still asleep
    engine.wake_up()
    assert not engine.is_sleeping()
    assert _greedy_text(engine, "c") == before


def test_sleep_refuses_a_bad_level_and_bad_tags(engine) -> None:
    with pytest.raises(ValueError, match="level"):
        engine.sleep(level=3)
    with pytest.raises(ValueError, match="tags"):
        engine.wake_up(tags=["bogus"])
