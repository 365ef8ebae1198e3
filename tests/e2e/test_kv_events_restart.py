"""A killed engine replica under load, in a two-replica stack: the router's picture of its cache
is dropped at once and routing goes on with the other replica; started again, it is a new
epoch whose snapshot (an empty cache) replaces everything the router knew of it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient, RequestError
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.stage_auth import STAGE_TOKEN_ENV
from strand.services.launch import Stack
from strand.services.tokenizer.routing import ReplicaRouter
from tests.e2e.conftest import start_stack

BLOCK_SIZE = 16
PARAMS = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.fixture(scope="module")
def dp_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with start_stack(tiny_model_dir, tmp_path_factory.mktemp("kv-restart-logs"),
                     data_parallel_size=2) as s:
        yield s


class Load:
    """Distinct two-block prompts, a few at a time, through the gateway until stopped."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.finish_reasons: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        with EngineClient(self.address, timeout=30) as client:
            n = 0
            while not self._stop.is_set():
                try:
                    for _ in range(4):
                        n += 1
                        client.add_request(f"load-{n}", {
                            "prompt_token_ids": [n % 500] * (2 * BLOCK_SIZE) + [1]}, PARAMS)
                    deadline = time.monotonic() + 30
                    while client.has_unfinished_requests() and time.monotonic() < deadline:
                        self.finish_reasons += [
                            o.outputs[0].finish_reason or "" for o in client.step()
                            if isinstance(o, RequestOutput) and o.finished]
                except (RequestError, grpc.RpcError) as exc:
                    # The killed replica's requests end, or a call meets the replica while it
                    # leaves the rotation: a client retries, as this load does.
                    self.errors.append(str(exc))
                    time.sleep(0.1)


async def _until(what: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_a_killed_replicas_cache_leaves_the_routers_picture_and_its_restart_is_a_new_epoch(
        dp_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STAGE_TOKEN_ENV, dp_stack.stage_token)  # as the stack's tokenizer calls
    doomed, survivor = dp_stack.address("engine-0"), dp_stack.address("engine-1")

    async def run() -> None:
        engines = EngineReplicas.connect([doomed, survivor])
        replicas = ReplicaRouter(engines, BLOCK_SIZE)
        router, index = replicas.router, replicas.router.index
        engines.start()
        replicas.start()
        try:
            await _until(lambda: all(s.subscribed for s in replicas._subscriptions.values()))
            with Load(dp_stack.gateway_address) as load:
                await _until(lambda: bool(index.blocks(doomed)) and bool(index.blocks(survivor)))
                resume = index.resume_point(doomed)
                assert resume is not None
                old_epoch = resume[1]
                await asyncio.to_thread(dp_stack.kill, "engine-0")
                await _until(lambda: doomed not in router.replicas())
                assert index.blocks(doomed) == set()
                prompt = [5] * (2 * BLOCK_SIZE)
                assert {router.route(prompt) for _ in range(4)} == {survivor}
                served = len(load.finish_reasons)
                await _until(lambda: load.finish_reasons[served:].count("length") >= 4)
            await asyncio.to_thread(dp_stack.start, "engine-0")
            await _until(lambda: doomed in router.replicas()
                         and (index.resume_point(doomed) or ("", ""))[1] not in ("", old_epoch))
            assert index.blocks(doomed) == set()  # the new process caches nothing yet
            assert index.blocks(survivor)
        finally:
            await replicas.close()
            await engines.close()

    asyncio.run(run())
