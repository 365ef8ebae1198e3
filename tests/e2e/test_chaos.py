"""Chaos under load: while streams run, each stage of the ring is killed (SIGKILL) in turn and the
supervisor starts it again. Every in-flight stream ends with a clear outcome (a finish_reason or a
gRPC status naming the trouble) well before its deadline, streams opened after each restart
finish normally, and once the load stops nothing is left behind: the gateway and the engine
count no request, and the prefix cache resets without touching running requests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import gateway_pb2_grpc
from strand.services.common.convert import params_to_pb, prompt_to_pb
from strand.services.launch import Stack, wait_healthy
from strand.services.supervisor import Supervisor
from tests.e2e.conftest import engine_num_unfinished, start_stack

STREAMS = 6  # concurrent streams of the steady load
STREAM_DEADLINE_S = 30.0  # no stream may outlive this: a hang shows as DEADLINE_EXCEEDED
VICTIMS = ("tokenizer", "engine", "detokenizer")
# What a stream cut by a dead stage may end with; anything else (a hang included) fails.
CLEAR_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED}
CLEAR_REASONS = {"length", "error", "abort"}


@pytest.fixture(scope="module")
def chaos_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Stack]:
    with start_stack(tiny_model_dir, tmp_path_factory.mktemp("chaos-logs"),
                     ["--auto-step"]) as s:
        yield s


class SupervisorThread:
    """`strand serve`'s supervisor, ticking on a thread while the test runs."""

    def __init__(self, stack: Stack) -> None:
        self.lines: list[str] = []
        self.supervisor = Supervisor(stack, log=self.lines.append)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.supervisor.tick()

    def __enter__(self) -> SupervisorThread:
        self.supervisor.tick()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


async def _one_stream(stub: gateway_pb2_grpc.GatewayStub, request_id: str) -> str:
    """How one stream ended: "ok:<finish_reason>" or "status:<code name>"."""
    params = params_to_pb(SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True))
    last = None
    try:
        async for output in stub.Generate(gpb.GenerateRequest(
                request_id=request_id, prompt=prompt_to_pb(f"chaos stream {request_id}"),
                params=params), timeout=STREAM_DEADLINE_S):
            last = output
    except grpc.aio.AioRpcError as exc:
        return f"status:{exc.code().name}"
    assert last is not None and last.finished
    return f"ok:{last.outputs[0].finish_reason}"


async def _load(address: str, stop: asyncio.Event, outcomes: list[tuple[float, str]]) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        counter = iter(range(1_000_000))

        async def worker() -> None:
            while not stop.is_set():
                started = time.monotonic()
                outcome = await _one_stream(stub, f"chaos-{next(counter)}")
                outcomes.append((time.monotonic() - started, outcome))
                if outcome.startswith("status:"):
                    await asyncio.sleep(0.2)  # a client backs off before it retries
        await asyncio.gather(*(worker() for _ in range(STREAMS)))


async def _streams_finish_normally(address: str, count: int) -> list[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        return list(await asyncio.gather(*(_one_stream(stub, f"after-{time.monotonic()}-{i}")
                                           for i in range(count))))


def _chaos(stack: Stack) -> tuple[list[tuple[float, str]], list[str], list[str]]:
    outcomes: list[tuple[float, str]] = []
    after: list[str] = []

    async def run() -> None:
        stop = asyncio.Event()
        load = asyncio.create_task(_load(stack.gateway_address, stop, outcomes))
        with SupervisorThread(stack) as supervisor:
            for victim in VICTIMS:
                await asyncio.sleep(1.0)  # streams in flight at every stage
                stack.kill(victim)
                deadline = time.monotonic() + 60
                while not any(line.startswith(f"strand: {victim} exited")
                              for line in supervisor.lines):
                    assert time.monotonic() < deadline, f"{victim} was not restarted"
                    await asyncio.sleep(0.1)
                await asyncio.to_thread(wait_healthy, stack.address(victim), 90, None, victim)
                # The gateway's readiness (what a load balancer reads) says the ring is whole
                # again: from then on new streams finish as they would have before.
                await asyncio.to_thread(wait_healthy, stack.gateway_address, 30, None, "gateway")
                after.extend(await _streams_finish_normally(stack.gateway_address, 2))
            stop.set()
            await load
        lines.extend(supervisor.lines)

    lines: list[str] = []
    asyncio.run(run())
    return outcomes, after, lines


def test_killing_each_stage_under_load_leaves_clear_endings_and_nothing_behind(
        chaos_stack: Stack) -> None:
    outcomes, after, lines = _chaos(chaos_stack)
    kinds = Counter(outcome for _, outcome in outcomes)
    for outcome in kinds:
        kind, _, value = outcome.partition(":")
        if kind == "ok":
            assert value in CLEAR_REASONS, kinds
        else:
            assert grpc.StatusCode[value] in CLEAR_CODES, kinds
    # No stream hung until its deadline: each ended within a fraction of it.
    assert max(seconds for seconds, _ in outcomes) < STREAM_DEADLINE_S * 0.8, kinds
    assert kinds["ok:length"] > 0, kinds
    # The kills did cut streams in flight (else this test would prove nothing).
    assert sum(kinds.values()) > kinds["ok:length"], kinds
    assert after == ["ok:length"] * 2 * len(VICTIMS), after
    assert [line.split(" exited")[0] for line in lines if " exited" in line] == [
        f"strand: {victim}" for victim in VICTIMS]

    # Idle: nothing is left anywhere, and the cache resets without touching running requests.
    with grpc.insecure_channel(chaos_stack.gateway_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        deadline = time.monotonic() + 20
        while stub.GetNumUnfinishedRequests(gpb.GetNumUnfinishedRequestsRequest(),
                                            timeout=10).value:
            assert time.monotonic() < deadline, "the gateway still counts requests"
            time.sleep(0.1)
        assert engine_num_unfinished(chaos_stack) == 0
        assert stub.ResetPrefixCache(gpb.ResetPrefixCacheRequest(reset_running_requests=False),
                                     timeout=10).success
