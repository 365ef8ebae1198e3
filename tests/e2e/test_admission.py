"""Admission control: beyond --max-waiting-requests an add is RESOURCE_EXHAUSTED saying what is
full (not a bare CANCELLED after a timeout), and nothing of it is left in any stage."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import openai
import pytest

from strand.engine_core.config import EngineArgs
from strand.engine_core.errors import QueueFullError
from strand.engine_core.llm_engine import LLMEngine
from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from strand.services.launch import REPO_ROOT, Stack, free_port
from strand.services.openai.health import wait_http_healthy
from tests.e2e.conftest import engine_num_unfinished, start_stack
from tests.e2e.metrics_scrape import scrape, value

PARAMS = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.fixture(scope="module")
def small_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Stack]:
    with start_stack(tiny_model_dir, tmp_path_factory.mktemp("admission-logs"),
                     engine_args=["--max-waiting-requests", "2"], metrics_port=0) as s:
        yield s


def test_beyond_the_waiting_bound_adds_are_resource_exhausted(small_stack: Stack) -> None:
    with EngineClient(small_stack.gateway_address, timeout=30) as client:
        client.add_request("w1", "one", PARAMS)
        client.add_request("w2", "two", PARAMS)  # manual mode: both wait for a step
        with pytest.raises(grpc.RpcError) as err:
            client.add_request("w3", "three", PARAMS)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "waiting queue is full" in err.value.details()
        assert "max_waiting_requests" in err.value.details()
        assert client.get_num_unfinished_requests() == 2
        assert engine_num_unfinished(small_stack) == 2
        # Refused, not aborted: the stages took it back out, and the metrics say so.
        refused = {"outcome": "RESOURCE_EXHAUSTED"}
        assert value(scrape(small_stack, "gateway")[1], "strand:gateway_requests_total",
                     refused) == 1
        assert value(scrape(small_stack, "tokenizer")[1], "strand:tokenizer_requests_total",
                     refused) == 1
        assert value(scrape(small_stack, "detokenizer")[1], "strand:request_success_total",
                     {"finished_reason": "abort"}) == 0
        while client.has_unfinished_requests():
            client.step()
        client.add_request("w3", "three, later", PARAMS)  # room again once they ran
        while client.has_unfinished_requests():
            client.step()


def test_the_openai_front_answers_a_full_queue_with_429(small_stack: Stack) -> None:
    port = free_port()
    front = subprocess.Popen(
        [sys.executable, "-m", "strand.services.openai", "--port", str(port),
         "--gateway-addr", small_stack.gateway_address], cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http_healthy(f"http://127.0.0.1:{port}/health", 60, front)
        with EngineClient(small_stack.gateway_address, timeout=30) as client:
            client.add_request("w1", "one", PARAMS)
            client.add_request("w2", "two", PARAMS)  # the queue is full
            with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                               max_retries=0) as oai:
                with pytest.raises(openai.RateLimitError) as err:
                    oai.completions.create(model=small_stack.config.model, prompt="three",
                                           max_tokens=2)
            error = err.value.response.json()["error"]
            assert error["code"] == "rate_limit_exceeded"
            assert "waiting queue is full" in error["message"]
            while client.has_unfinished_requests():
                client.step()
    finally:
        front.terminate()
        front.wait(timeout=10)


def test_in_process_the_bound_is_off_unless_set(tiny_model_dir: Path) -> None:
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                   kv_cache_memory=8 * 1024**2,
                                                   max_waiting_requests=1))
    engine.add_request("a", "one", PARAMS)
    with pytest.raises(QueueFullError, match="waiting queue is full"):
        engine.add_request("b", "two", PARAMS)
    assert engine.get_num_unfinished_requests() == 1
    assert EngineArgs(model=str(tiny_model_dir)).max_waiting_requests is None
