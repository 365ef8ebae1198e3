"""Real processes: one shared manual-mode stack for most tests, own stacks for the rest."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import engine_pb2_grpc, gateway_pb2_grpc
from strand.services.client import EngineClient
from strand.services.common.stage_auth import STAGE_TOKEN_ENV
from strand.services.launch import (
    REPO_ROOT,
    STAGES,
    Stack,
    StackConfig,
    free_port,
    launch_stack,
    wait_healthy,
)
from tests.e2e.otlp_receiver import OtlpReceiver

# Small enough that a test can exceed it cheaply; the stack keeps serving after that.
GATEWAY_MAX_MESSAGE_BYTES = 1024 * 1024
ENGINE_FLAGS = ["--max-num-seqs", "64", "--kv-cache-memory", str(64 * 1024**2)]


def start_stack(model_dir: Path, log_dir: Path, gateway_args: list[str] | None = None,
                otlp: str | None = None, engine_args: list[str] | None = None,
                metrics_port: int | None = None, data_parallel_size: int = 1,
                openai_port: int | None = None) -> Stack:
    """A stack with ENGINE_FLAGS plus engine_args (later flags win) for every stage."""
    config = StackConfig(model=str(model_dir), engine_args=[*ENGINE_FLAGS, *(engine_args or [])],
                         gateway_args=list(gateway_args or []), log_dir=log_dir,
                         otlp_traces_endpoint=otlp, metrics_port=metrics_port,
                         data_parallel_size=data_parallel_size, openai_port=openai_port)
    return launch_stack(config, timeout=120)


@pytest.fixture(scope="session")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("stack-logs")
    # Generate streams never step themselves here: these tests drive every step with Step.
    # Every service serves /metrics on a free port (tests/e2e/test_metrics.py scrapes them).
    with start_stack(tiny_model_dir, log_dir,
                     ["--max-message-bytes", str(GATEWAY_MAX_MESSAGE_BYTES),
                      "--self-step-after", "3600"], metrics_port=0) as s:
        yield s


API_KEY = "test-secret"


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def auto_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
               otlp_receiver: OtlpReceiver) -> Iterator[Stack]:
    """Auto-step mode, an api key, and every service exporting traces to the test's receiver."""
    log_dir = tmp_path_factory.mktemp("auto-stack-logs")
    with start_stack(tiny_model_dir, log_dir, ["--auto-step", "--api-key", API_KEY],
                     otlp=otlp_receiver.endpoint) as s:
        yield s


@pytest.fixture
def auto_client(auto_stack: Stack) -> Iterator[EngineClient]:
    with EngineClient(auto_stack.gateway_address, api_key=API_KEY, timeout=60) as c:
        yield c


@pytest.fixture
def client(stack: Stack) -> Iterator[EngineClient]:
    with EngineClient(stack.gateway_address, timeout=60) as c:
        yield c
        # Tests share the stack: none may leave a request behind for the next one.
        assert c.get_num_unfinished_requests() == 0


@pytest.fixture
def gateway_stub(stack: Stack) -> Iterator[gateway_pb2_grpc.GatewayStub]:
    with grpc.insecure_channel(stack.gateway_address) as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)


def engine_num_unfinished(stack: Stack) -> int:
    """Asked of the engine stage directly, past the gateway."""
    with grpc.insecure_channel(stack.address("engine")) as channel:
        responses = engine_pb2_grpc.EngineStub(channel).Session(
            iter([epb.EngineRequest(seq=1, query=epb.EngineQuery())]), timeout=30,
            metadata=(("authorization", f"Bearer {stack.stage_token}"),))
        return int(next(iter(responses)).state.num_unfinished_requests)


def start_side_gateway(stack: Stack, extra_args: list[str] | None = None,
                       root_certificates: bytes | None = None
                       ) -> tuple[subprocess.Popen[bytes], str]:
    """A second gateway on the shared stack's stages (its own sessions with each stage)."""
    port = free_port()
    command = [sys.executable, "-m", "strand.services.gateway", "--port", str(port),
               *[f"--{s}-addr={stack.address(s)}" for s in STAGES], *(extra_args or [])]
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(REPO_ROOT),
                                             STAGE_TOKEN_ENV: stack.stage_token},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    try:
        wait_healthy(address, 60, process, "side gateway", root_certificates)
    except BaseException:
        process.kill()
        raise
    return process, address
