"""KV cache control through the gateway: Clear empties one location, Lookup says per location
how many leading tokens of a prompt are cached, and reset_prefix_cache reaches the connector."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services._proto.strand.v1 import control_pb2_grpc, gateway_pb2_grpc
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.client import EngineClient, RequestError
from strand.services.launch import Stack
from tests.e2e.conftest import start_stack

BLOCK_SIZE = 16  # EngineArgs' default
# 40 tokens: two full blocks (32 tokens) can be cached; the last partial block never is.
PROMPT = list(range(100, 140))
OFFLOAD_BYTES = 1 << 20


def _serve(client: EngineClient, request_id: str, prompt: list[int]) -> None:
    client.add_request(request_id, {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=2))
    while client.has_unfinished_requests():
        client.step()


@pytest.fixture(scope="module")
def offload_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Stack]:
    engine_args = ["--kv-connector", "offload", "--kv-offload-bytes", str(OFFLOAD_BYTES),
                   "--kv-events"]
    with start_stack(tiny_model_dir, tmp_path_factory.mktemp("offload-logs"),
                     engine_args=engine_args) as s:
        yield s


@pytest.fixture
def offload_client(offload_stack: Stack) -> Iterator[EngineClient]:
    with EngineClient(offload_stack.gateway_address, timeout=30) as c:
        yield c


def test_lookup_after_serving_a_prompt_reports_its_full_blocks_on_device(
        client: EngineClient) -> None:
    prompt = [p + 1 for p in PROMPT]
    assert client.lookup_kv_cache(prompt) == {"device": 0, "cpu": 0}
    _serve(client, "kv-served", prompt)
    found = client.lookup_kv_cache(prompt)
    assert found["device"] == 2 * BLOCK_SIZE
    assert found["cpu"] == 0  # no connector on this stack


def test_clear_device_returns_an_event_id_and_lookup_then_reports_zero(
        client: EngineClient) -> None:
    prompt = [p + 2 for p in PROMPT]
    _serve(client, "kv-cleared", prompt)
    event_id, num_cleared = client.clear_kv_cache("", "device")
    assert event_id.startswith("kv-clear-")
    assert num_cleared >= 2 * BLOCK_SIZE
    assert client.lookup_kv_cache(prompt)["device"] == 0


def test_clear_names_this_engine_by_instance_id(client: EngineClient) -> None:
    first, _ = client.clear_kv_cache("engine-0", "device")
    second, num_cleared = client.clear_kv_cache("engine-0", "device")
    assert first != second
    assert num_cleared == 0  # nothing was cached since the first clear


def test_unknown_location_is_invalid_argument_naming_location(
        gateway_stub: gateway_pb2_grpc.GatewayStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        gateway_stub.ClearKvCache(gpb.ClearKvCacheRequest(location="disk"), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("location")
    assert "disk" in err.value.details()


def test_unknown_instance_id_is_a_request_error_naming_instance_id(
        client: EngineClient) -> None:
    with pytest.raises(RequestError) as err:
        client.clear_kv_cache("engine-7", "device")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(err.value).startswith("instance_id")


def test_lookup_of_a_token_outside_the_vocab_is_invalid_argument(client: EngineClient) -> None:
    with pytest.raises(RequestError) as err:
        client.lookup_kv_cache([1, 2, 100000])
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(err.value).startswith("token_ids")


def test_offloaded_prompt_is_found_on_cpu_until_cpu_is_cleared(
        offload_client: EngineClient) -> None:
    prompt = [p + 3 for p in PROMPT]
    _serve(offload_client, "kv-offloaded", prompt)
    assert offload_client.lookup_kv_cache(prompt)["cpu"] == 2 * BLOCK_SIZE
    _, num_cleared = offload_client.clear_kv_cache("", "cpu")
    assert num_cleared >= 2 * BLOCK_SIZE
    found = offload_client.lookup_kv_cache(prompt)
    assert found["cpu"] == 0
    assert found["device"] == 2 * BLOCK_SIZE  # clearing one location leaves the other


def test_reset_prefix_cache_with_reset_connector_empties_cpu_and_device(
        offload_client: EngineClient) -> None:
    prompt = [p + 4 for p in PROMPT]
    _serve(offload_client, "kv-reset", prompt)
    assert offload_client.lookup_kv_cache(prompt) == {"device": 2 * BLOCK_SIZE,
                                                      "cpu": 2 * BLOCK_SIZE}
    assert offload_client.reset_prefix_cache(reset_connector=True) is True
    assert offload_client.lookup_kv_cache(prompt) == {"device": 0, "cpu": 0}


def test_reset_prefix_cache_without_reset_connector_keeps_cpu(
        offload_client: EngineClient) -> None:
    prompt = [p + 5 for p in PROMPT]
    _serve(offload_client, "kv-keep", prompt)
    assert offload_client.reset_prefix_cache() is True
    assert offload_client.lookup_kv_cache(prompt) == {"device": 0, "cpu": 2 * BLOCK_SIZE}


def test_control_reset_reports_what_each_tier_dropped(offload_stack: Stack,
                                                       offload_client: EngineClient) -> None:
    offload_client.reset_prefix_cache(reset_connector=True)  # start from empty tiers
    _serve(offload_client, "kv-tiers", [p + 6 for p in PROMPT])
    with grpc.insecure_channel(offload_stack.gateway_address) as channel:
        resp = control_pb2_grpc.ControlStub(channel).ResetPrefixCache(
            gpb.ResetPrefixCacheRequest(reset_connector=True), timeout=30)
    assert resp.success
    assert [(t.tier, t.reset, t.num_blocks) for t in resp.tiers] == [
        ("device", True, 2), ("cpu", True, 2)]


def test_get_loads_reports_the_engine_and_its_blocks(client: EngineClient) -> None:
    client.add_request("kv-load", {"prompt_token_ids": PROMPT},
                       SamplingParams(temperature=0.0, max_tokens=50))
    try:
        client.step()
        (load,) = client.get_loads()
        assert (load["num_running"], load["num_waiting"]) == (1, 0)
        assert load["kv_blocks_used"] >= 3  # 41 tokens in 16-token blocks
        assert load["tokens_in_flight"] == len(PROMPT) + 1
        assert load["engine"]
    finally:
        client.abort_request("kv-load")


def test_subscribe_kv_events_streams_stored_blocks_then_the_clear(
        offload_stack: Stack, offload_client: EngineClient) -> None:
    offload_client.reset_prefix_cache(reset_connector=True)
    prompt = [p + 7 for p in PROMPT]
    with grpc.insecure_channel(offload_stack.gateway_address) as channel:
        stream = control_pb2_grpc.ControlStub(channel).SubscribeKvEvents(
            cpb.SubscribeKvEventsRequest(), timeout=30)
        time.sleep(0.3)  # subscribed before the request runs
        _serve(offload_client, "kv-events", prompt)
        offload_client.reset_prefix_cache()
        events = []
        seqs = []
        stored_tokens = []
        for batch in stream:  # earlier tests' events first: the engine buffers them
            seqs.append(batch.seq)
            events += [e.WhichOneof("kind") for e in batch.events]
            stored_tokens += [list(e.block_stored.token_ids) for e in batch.events
                              if e.HasField("block_stored")]
            if events[-1:] == ["all_blocks_cleared"] and prompt[:32] in stored_tokens:
                stream.cancel()
                break
    assert seqs == sorted(seqs)
    # The prompt's two full blocks, as one chain of 2 hashes and 32 tokens.
    assert prompt[:2 * BLOCK_SIZE] in stored_tokens


def test_subscribe_kv_events_resumes_from_a_seq_or_opens_with_a_snapshot(
        offload_stack: Stack, offload_client: EngineClient) -> None:
    prompt = [p + 9 for p in PROMPT]
    with grpc.insecure_channel(offload_stack.gateway_address) as channel:
        control = control_pb2_grpc.ControlStub(channel)
        first = control.SubscribeKvEvents(cpb.SubscribeKvEventsRequest(), timeout=30)
        time.sleep(0.3)  # subscribed before the request runs
        _serve(offload_client, "kv-resume", prompt)
        stored = next(b for b in first if any(list(e.block_stored.token_ids) == prompt[:32]
                                              for e in b.events))
        first.cancel()
        hashes = [h for e in stored.events for h in e.block_stored.block_hashes]

        def opening(epoch: str) -> pb.KvEventBatch:
            stream = control.SubscribeKvEvents(cpb.SubscribeKvEventsRequest(resume=[
                cpb.KvEventsResume(engine=stored.engine, start_sequence_number=stored.seq,
                                   epoch=epoch)]), timeout=30)
            batch = next(stream)
            stream.cancel()
            return batch

        assert opening(stored.epoch) == stored  # replayed from the gateway's buffer
        snapshot = opening("another-epoch")
        assert snapshot.snapshot
        assert snapshot.events[0].HasField("all_blocks_cleared")
        assert set(hashes) <= set(snapshot.events[1].block_stored.block_hashes)


@pytest.mark.parametrize(("twice", "field"), [
    (False, "resume[0].engine must be one of"),
    (True, "resume[1].engine names"),
])
def test_subscribe_kv_events_refuses_a_bad_resume_point_naming_the_field(
        offload_stack: Stack, twice: bool, field: str) -> None:
    # An engine is named as its batches name it: the address the gateway reaches it at.
    engine = offload_stack.address("engine")
    engines = [engine, engine] if twice else ["no-such-engine"]
    with grpc.insecure_channel(offload_stack.gateway_address) as channel:
        stream = control_pb2_grpc.ControlStub(channel).SubscribeKvEvents(
            cpb.SubscribeKvEventsRequest(resume=[
                cpb.KvEventsResume(engine=name, start_sequence_number=1, epoch="e")
                for name in engines]), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            next(stream)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or "")
