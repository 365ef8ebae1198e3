"""tests/v1/engine/test_engine_core.py: EngineCore's request lifecycle, aborts, and the finished
ids it hands the model runner."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from strand.engine_core import EngineArgs
from strand.engine_core.core.engine import EngineCore
from strand.engine_core.core.engine_io import EngineCoreRequest
from strand.engine_core.model_executor.model_runner import ModelRunner
from strand.engine_core.sampling_params import SamplingParams

PROMPT_TOKENS = [5, 17, 42, 99, 7, 3, 250, 11, 64, 8, 31, 77]  # 12 tokens, as vLLM's prompt


def make_request(request_id: str | None = None, **params: object) -> EngineCoreRequest:
    params.setdefault("max_tokens", 4)
    return EngineCoreRequest(request_id=request_id or str(uuid.uuid4()),
                             prompt_token_ids=list(PROMPT_TOKENS),
                             sampling_params=SamplingParams(**params),  # type: ignore[arg-type]
                             eos_token_id=None, arrival_time=time.time())


@pytest.fixture(scope="module")
def engine_core(tiny_model_dir: Path) -> EngineCore:
    return EngineCore.from_engine_args(EngineArgs(
        model=str(tiny_model_dir), dtype="float32", device="cpu", num_gpu_blocks_override=64,
        max_model_len=128))


def _drain(core: EngineCore, max_steps: int = 200) -> None:
    for _ in range(max_steps):
        if not core.scheduler.has_requests() and not core.batch_queue:
            return
        core.step()
    raise AssertionError("engine core still busy")


def test_engine_core(engine_core: EngineCore) -> None:
    core = engine_core
    sched = core.scheduler
    core.add_request(make_request())
    assert (len(sched.waiting), len(sched.running)) == (1, 0)
    core.step()
    assert (len(sched.waiting), len(sched.running)) == (0, 1)
    core.add_request(make_request())
    core.step()
    assert (len(sched.waiting), len(sched.running)) == (0, 2)
    core.add_request(make_request())
    core.add_request(make_request())
    assert (len(sched.waiting), len(sched.running)) == (2, 2)
    core.step()
    assert (len(sched.waiting), len(sched.running)) == (0, 4)
    _drain(core)
    assert (len(sched.waiting), len(sched.running)) == (0, 0)

    # Abort cycle: the aborted id is a "finished request" until a step hands it to the runner.
    request = make_request()
    core.add_request(request)
    assert sched.has_unfinished_requests() and not sched.has_finished_requests()
    core.step()
    assert request.request_id in core.runner.requests
    core.abort_requests([request.request_id])
    assert not sched.has_unfinished_requests() and sched.has_finished_requests()
    outputs = core.step()  # schedules nothing, still flushes the finished id
    assert outputs.outputs == []
    assert not sched.has_finished_requests()
    assert request.request_id not in core.runner.requests

    # Abort one of three, then the other two at once.
    r0, r1, r2 = make_request(), make_request(), make_request()
    core.add_request(r0)
    core.add_request(r1)
    core.step()
    core.add_request(r2)
    core.step()
    assert len(sched.running) == 3
    core.abort_requests([r1.request_id])
    assert len(sched.running) == 2
    core.step()
    assert r1.request_id not in core.runner.requests
    core.abort_requests([r2.request_id, r0.request_id])
    assert (len(sched.waiting), len(sched.running)) == (0, 0)
    core.step()
    assert core.runner.requests == {}

    # The same id may be used again once the first request has finished.
    core.add_request(make_request("test"))
    _drain(core)
    core.add_request(make_request("test"))
    _drain(core)
    assert (len(sched.waiting), len(sched.running)) == (0, 0)


def test_engine_core_advanced_sampling(engine_core: EngineCore) -> None:
    core = engine_core
    for params in ({"min_tokens": 4, "presence_penalty": 1.0, "frequency_penalty": 1.0,
                    "repetition_penalty": 0.1, "stop_token_ids": [301, 302]},
                   {"top_p": 0.99, "top_k": 50}):
        request = make_request(max_tokens=6, **params)
        core.add_request(request)
        assert (len(core.scheduler.waiting), len(core.scheduler.running)) == (1, 0)
        tokens: list[int] = []
        for _ in range(50):
            if not core.scheduler.has_requests():
                break
            for out in core.step().outputs:
                tokens.extend(out.new_token_ids)
        assert (len(core.scheduler.waiting), len(core.scheduler.running)) == (0, 0)
        assert 4 <= len(tokens) <= 6


def test_engine_core_concurrent_batches(tiny_model_dir: Path) -> None:
    """max_concurrent_batches=2: step N+1 is scheduled while step N computes; each call then
    consumes the oldest batch's result."""
    core = EngineCore.from_engine_args(EngineArgs(
        model=str(tiny_model_dir), dtype="float32", device="cpu", num_gpu_blocks_override=64,
        max_model_len=128, max_num_seqs=2, enable_prefix_caching=False,
        max_num_batched_tokens=10, max_concurrent_batches=2))
    queue = core.batch_queue
    assert queue is not None
    req0, req1 = make_request("0", max_tokens=5), make_request("1", max_tokens=5)
    core.add_request(req0)
    core.add_request(req1)
    requests = core.scheduler.requests

    # Batch 1: (10, req0); nothing to return yet.
    assert core.step().outputs == []
    assert len(queue) == 1 and queue.newest().num_scheduled_tokens == {"0": 10}
    assert requests["0"].num_computed_tokens == 10  # advanced when scheduled
    # Batch 2: (2, req0), (8, req1); batch 1 (a partial prefill) completes with no tokens.
    assert core.step().outputs == []
    assert len(queue) == 1 and queue.newest().num_scheduled_tokens == {"0": 2, "1": 8}
    assert (requests["0"].num_computed_tokens, requests["1"].num_computed_tokens) == (12, 8)
    # Batch 3: (4, req1) only: req0 waits for its first token, which batch 2 delivers now.
    outputs = core.step().outputs
    assert queue.newest().num_scheduled_tokens == {"1": 4}
    assert [o.request_id for o in outputs] == ["0"] and requests["0"].num_tokens == 13
    # Batch 4: (1, req0); batch 3 gives req1's first token.
    outputs = core.step().outputs
    assert queue.newest().num_scheduled_tokens == {"0": 1}
    assert [o.request_id for o in outputs] == ["1"] and requests["1"].num_tokens == 13
    # From here the two requests alternate: every call consumes one batch, one token.
    expected = {"0": 14, "1": 14}
    turn = "0"
    for _ in range(20):
        if core.scheduler.get_num_unfinished_requests() < 2:
            break
        outputs = core.step().outputs
        assert [o.request_id for o in outputs] == [turn]
        if turn in requests:
            assert requests[turn].num_tokens == expected[turn]
        expected[turn] += 1
        turn = "1" if turn == "0" else "0"
    _drain(core)
    assert not core.has_unfinished_requests() and len(queue) == 0
    core.batch_queue.shutdown()  # type: ignore[union-attr]


def test_engine_core_concurrent_batches_refused_with_a_connector(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="max_concurrent_batches must be 1 with a KV connector"):
        EngineCore.from_engine_args(EngineArgs(
            model=str(tiny_model_dir), dtype="float32", device="cpu",
            num_gpu_blocks_override=64, max_model_len=128, max_concurrent_batches=2,
            kv_connector="offload", kv_offload_bytes=1 << 20))


def _rank_and_cache_shape(worker: ModelRunner) -> tuple[int, int, int]:
    """Module level: with tensor parallelism the callable is pickled to the worker ranks."""
    assert worker.tp is not None
    return worker.tp.rank, worker.kv_caches[0].shape[1], worker.kv_caches[0].shape[3]


def test_engine_core_tp(tiny_model_dir: Path) -> None:
    """vLLM's: the engine initializes a worker per rank; collective_rpc reaches each of them."""
    core = EngineCore.from_engine_args(EngineArgs(
        model=str(tiny_model_dir), dtype="float32", device="cpu", num_gpu_blocks_override=16,
        max_model_len=128, tensor_parallel_size=2, cpu_threads=1))
    try:
        # Rank order; each rank's cache has the pool's 16 blocks and 1 of the 2 KV heads.
        assert core.collective_rpc(_rank_and_cache_shape) == [(0, 16, 1), (1, 16, 1)]
        with pytest.raises(ValueError, match="rank 0: .*rank 1: "):
            core.collective_rpc("no_such_method")
        # A failed call ends no worker: the engine still steps.
        core.add_request(make_request("tp", max_tokens=3))
        _drain(core)
        assert core.is_healthy()
    finally:
        core.shutdown()


def test_engine_core_invalid_request_id_type(engine_core: EngineCore) -> None:
    for bad in (uuid.uuid4(), 12345):
        request = make_request()
        request.request_id = bad  # type: ignore[assignment]
        with pytest.raises(ValueError, match="request_id must be a str"):
            engine_core.add_request(request)
    assert not engine_core.scheduler.has_unfinished_requests()
