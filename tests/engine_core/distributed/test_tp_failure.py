"""A tensor-parallel engine never hangs on a lost rank: joining times out with an error naming
the rank, and a worker that dies (or stops answering) mid-run ends every in-flight request with
finish_reason "error" and a reason naming it; the engine then reports itself unhealthy."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from strand.engine_core import LLMEngine, RequestOutput, SamplingParams
from strand.engine_core.distributed.driver import TPDriverRunner, free_port
from strand.engine_core.distributed.parallel_state import (
    CollectiveError,
    DistributedInit,
    init_tp_group,
)
from strand.engine_core.errors import WorkerFailedError
from tests.engine_core.distributed.conftest import tp_engine


def test_joining_without_the_other_rank_times_out_naming_the_rank() -> None:
    init = DistributedInit(world_size=2, master_port=free_port("127.0.0.1"), timeout_s=2.0)
    start = time.monotonic()
    with pytest.raises(CollectiveError, match=r"rank 0: init_process_group .* 2 ranks"):
        init_tp_group(init, rank=0)
    assert time.monotonic() - start < 30


def _start_requests(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=50)
    for i in range(2):
        engine.add_request(str(i), {"prompt_token_ids": [5 + i] * 12}, params)
    for _ in range(3):
        assert all(not out.finished for out in engine.step())


def _assert_ended_with_error(engine: LLMEngine, reason: str) -> None:
    outputs = {out.request_id: out for out in engine.step() if isinstance(out, RequestOutput)}
    assert sorted(outputs) == ["0", "1"]
    for out in outputs.values():
        assert out.finished and out.outputs[0].finish_reason == "error"
        assert out.error is not None and reason in out.error
    assert not engine.has_unfinished_requests()
    assert not engine.is_healthy()
    with pytest.raises(WorkerFailedError, match=re.escape(reason)):
        engine.add_request("late", {"prompt_token_ids": [5]}, SamplingParams(max_tokens=1))


def _worker_pid(engine: LLMEngine) -> int:
    runner = engine.engine_core.runner
    assert isinstance(runner, TPDriverRunner)
    pid = runner.procs[0].pid
    assert pid is not None
    return pid


def test_a_killed_worker_ends_in_flight_requests_with_error(tiny_model_dir: Path) -> None:
    with tp_engine(tiny_model_dir, 2, num_gpu_blocks_override=32) as engine:
        _start_requests(engine)
        os.kill(_worker_pid(engine), signal.SIGKILL)
        time.sleep(0.2)
        _assert_ended_with_error(engine, "rank 1 (exit code -9)")


def test_a_stopped_worker_times_out_the_step_instead_of_hanging(tiny_model_dir: Path) -> None:
    with tp_engine(tiny_model_dir, 2, num_gpu_blocks_override=32,
                   distributed_timeout_s=4.0) as engine:
        _start_requests(engine)
        os.kill(_worker_pid(engine), signal.SIGSTOP)
        start = time.monotonic()
        _assert_ended_with_error(engine, "timeout 4s")
        assert time.monotonic() - start < 30


def test_a_failed_start_leaves_no_group_behind(tiny_model_dir: Path) -> None:
    import torch.distributed as dist

    # Every rank refuses the KV budget; the engine raises it and leaves the process clean.
    with pytest.raises(ValueError, match="kv_cache_memory"):
        with tp_engine(tiny_model_dir, 2, kv_cache_memory=1024):
            pass
    assert not dist.is_initialized()
