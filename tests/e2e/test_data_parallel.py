"""Two engine replicas of the tiny model behind one gateway (`--data-parallel-size 2`): the
tokenizer's kv-aware router sends a shared prefix to the replica that cached it and spreads
distinct prompts, greedy outputs equal one engine's, engine-wide calls reach both replicas and
report each, and a killed replica's requests end with "error" while the other's go on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.engine_core.config import EngineArgs
from strand.engine_core.llm_engine import LLMEngine
from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services._proto.strand.v1 import control_pb2_grpc
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.client import EngineClient
from strand.services.launch import Stack
from tests.e2e.conftest import ENGINE_FLAGS, start_stack

BLOCK_SIZE = 16
PREFIX = list(range(100, 100 + 4 * BLOCK_SIZE))  # four full blocks
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.fixture(scope="module")
def dp_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with start_stack(tiny_model_dir, tmp_path_factory.mktemp("dp-logs"),
                     data_parallel_size=2) as s:
        yield s


@pytest.fixture
def dp_client(dp_stack: Stack) -> Iterator[EngineClient]:
    with EngineClient(dp_stack.gateway_address, timeout=30) as c:
        yield c
        assert c.get_num_unfinished_requests() == 0


@pytest.fixture
def control(dp_stack: Stack) -> Iterator[control_pb2_grpc.ControlStub]:
    with grpc.insecure_channel(dp_stack.gateway_address) as channel:
        yield control_pb2_grpc.ControlStub(channel)


def _serve(client: EngineClient, prompts: dict[str, list[int]],
           params: SamplingParams = GREEDY) -> dict[str, RequestOutput]:
    """Add every prompt, then step until all have finished."""
    for request_id, prompt in prompts.items():
        client.add_request(request_id, {"prompt_token_ids": prompt}, params)
    finals: dict[str, RequestOutput] = {}
    deadline = time.monotonic() + 30
    while client.has_unfinished_requests() and time.monotonic() < deadline:
        finals.update({o.request_id: o for o in client.step()
                       if isinstance(o, RequestOutput) and o.finished})
    return finals


def _loads(control: control_pb2_grpc.ControlStub) -> dict[str, pb.EngineLoad]:
    return {load.engine: load for load in control.GetLoads(cpb.GetLoadsRequest(),
                                                           timeout=10).loads}


def _reset(control: control_pb2_grpc.ControlStub) -> gpb.ResetPrefixCacheResponse:
    resp = control.ResetPrefixCache(gpb.ResetPrefixCacheRequest(), timeout=10)
    time.sleep(0.3)  # the router's index hears of the clear (KV events) before new requests
    return resp


def _cached_on(control: control_pb2_grpc.ControlStub, prompt: list[int]) -> dict[str, int]:
    resp = control.LookupKvCache(gpb.LookupKvCacheRequest(token_ids=prompt), timeout=10)
    return {r.engine: r.num_cached_tokens["device"] for r in resp.replicas}


def test_server_info_and_loads_list_both_replicas(dp_stack: Stack,
                                                  control: control_pb2_grpc.ControlStub) -> None:
    replicas = {dp_stack.address("engine-0"), dp_stack.address("engine-1")}
    info = control.GetServerInfo(gpb.GetServerInfoRequest(), timeout=10)
    assert {r.engine for r in info.replicas} == replicas
    assert all(r.healthy and r.num_blocks > 0 for r in info.replicas)
    assert info.num_blocks == sum(r.num_blocks for r in info.replicas)
    assert set(_loads(control)) == replicas


def test_requests_sharing_a_long_prefix_land_on_the_replica_that_cached_it(
        dp_client: EngineClient, control: control_pb2_grpc.ControlStub) -> None:
    _reset(control)
    _serve(dp_client, {"p0": [*PREFIX, 300]})
    cached = _cached_on(control, PREFIX)
    holder = max(cached, key=lambda e: cached[e])
    assert sorted(cached.values()) == [0, len(PREFIX)]  # one replica holds it
    _serve(dp_client, {f"p{i}": [*PREFIX, 300 + i] for i in range(1, 4)})
    loads = _loads(control)
    other = next(e for e in loads if e != holder)
    assert loads[holder].prefix_cache_hits == 3 * len(PREFIX)  # each follow-up hit 4 blocks
    assert loads[other].prefix_cache_queries == 0  # and none went elsewhere


def test_requests_with_different_prefixes_spread_over_both_replicas(
        dp_client: EngineClient, control: control_pb2_grpc.ControlStub) -> None:
    _reset(control)
    _serve(dp_client, {f"d{i}": [20 + i] * (2 * BLOCK_SIZE) + [i] for i in range(4)})
    loads = _loads(control)
    assert len(loads) == 2
    assert all(load.prefix_cache_queries > 0 for load in loads.values())


def test_greedy_outputs_equal_one_engines(tiny_model_dir: Path, dp_client: EngineClient) -> None:
    import torch

    torch.set_num_threads(1)
    local = LLMEngine.from_engine_args(EngineArgs(
        model=str(tiny_model_dir), max_num_seqs=int(ENGINE_FLAGS[1]),
        kv_cache_memory=int(ENGINE_FLAGS[3])))
    prompts = {f"g{i}": [*PREFIX[: 8 * (i + 1)], 40 + i] for i in range(4)}
    params = SamplingParams(temperature=0.0, max_tokens=8)
    got = _serve(dp_client, prompts, params)
    expected = _serve(local, prompts, params)  # type: ignore[arg-type]
    assert set(got) == set(prompts)
    for request_id, output in expected.items():
        assert got[request_id].outputs[0].token_ids == output.outputs[0].token_ids
        assert got[request_id].outputs[0].text == output.outputs[0].text


def test_reset_reaches_both_replicas_and_reports_each(
        dp_client: EngineClient, control: control_pb2_grpc.ControlStub) -> None:
    _reset(control)
    prompts = {f"r{i}": [60 + i] * (2 * BLOCK_SIZE) + [i] for i in range(2)}
    _serve(dp_client, prompts)
    resp = _reset(control)
    assert resp.success
    assert len(resp.replicas) == 2
    assert all(r.success and r.tiers[0].num_blocks >= 2 for r in resp.replicas)
    assert resp.tiers[0].num_blocks == sum(r.tiers[0].num_blocks for r in resp.replicas)
    for prompt in prompts.values():
        assert set(_cached_on(control, prompt).values()) == {0}


def test_kv_events_and_clear_name_the_replica(
        dp_client: EngineClient, control: control_pb2_grpc.ControlStub) -> None:
    _reset(control)
    prompt = [70] * (2 * BLOCK_SIZE) + [1]
    stream = control.SubscribeKvEvents(cpb.SubscribeKvEventsRequest(), timeout=30)
    try:
        time.sleep(0.5)  # subscribed (to both engines) before the request runs
        _serve(dp_client, {"ev": prompt})
        holder = next(e for e, n in _cached_on(control, prompt).items() if n)
        for batch in stream:
            if not batch.snapshot and any(e.HasField("block_stored") for e in batch.events):
                assert batch.engine == holder
                break
    finally:
        stream.cancel()
    # A replica's address as instance_id clears that replica only.
    other = next(e for e in _cached_on(control, prompt) if e != holder)
    cleared = control.ClearKvCache(gpb.ClearKvCacheRequest(instance_id=other,
                                                           location="device"), timeout=10)
    assert [r.engine for r in cleared.replicas] == [other]
    assert _cached_on(control, prompt)[holder] == 2 * BLOCK_SIZE
    cleared = control.ClearKvCache(gpb.ClearKvCacheRequest(location="device"), timeout=10)
    assert len(cleared.replicas) == 2 and cleared.num_tokens_cleared >= 2 * BLOCK_SIZE
    assert set(_cached_on(control, prompt).values()) == {0}


def test_killed_replica_ends_its_requests_with_error_while_the_other_continues(
        dp_stack: Stack, dp_client: EngineClient,
        control: control_pb2_grpc.ControlStub) -> None:
    _reset(control)
    params = SamplingParams(temperature=0.0, max_tokens=30)
    for i in range(2):
        dp_client.add_request(f"k{i}", {"prompt_token_ids": [80 + i] * 20}, params)
    dp_client.step()
    doomed = dp_stack.address("engine-0")
    assert {e: load.num_running for e, load in _loads(control).items()} == {
        doomed: 1, dp_stack.address("engine-1"): 1}
    dp_stack.kill("engine-0")
    finals: dict[str, RequestOutput] = {}
    deadline = time.monotonic() + 30
    while len(finals) < 2 and time.monotonic() < deadline:
        finals.update({o.request_id: o for o in dp_client.step()
                       if isinstance(o, RequestOutput) and o.finished})
    reasons = sorted(o.outputs[0].finish_reason or "" for o in finals.values())
    assert reasons == ["error", "length"]
    errored = next(o for o in finals.values() if o.outputs[0].finish_reason == "error")
    assert "engine stage is unavailable" in (errored.error or "")
    info = control.GetServerInfo(gpb.GetServerInfoRequest(), timeout=10)
    assert {r.engine: r.healthy for r in info.replicas}[doomed] is False
    # New requests go to the replica still in rotation.
    assert _serve(dp_client, {"after": [90] * 20})["after"].outputs[0].finish_reason == "length"
    dp_stack.start("engine-0")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        info = control.GetServerInfo(gpb.GetServerInfoRequest(), timeout=10)
        if all(r.healthy for r in info.replicas):
            break
        time.sleep(0.2)
    assert all(r.healthy for r in info.replicas)
