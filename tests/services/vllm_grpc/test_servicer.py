"""Every VllmEngine RPC through smg-grpc-proto's own stub, against a real Strand stack."""

from __future__ import annotations

import hashlib
import io
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2 as cmn
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

from tests.services.vllm_grpc.conftest import PROMPT_IDS, greedy_in_process

Stub = Any


def generate(stub: Stub, request_id: str, stream: bool, **params: Any
             ) -> list[vpb.GenerateResponse]:
    request = vpb.GenerateRequest(request_id=request_id,
                                  tokenized=vpb.TokenizedInput(input_ids=PROMPT_IDS),
                                  sampling_params=vpb.SamplingParams(**params), stream=stream)
    return list(stub.Generate(request, timeout=120))


def wait_idle(stub: Stub, timeout: float = 30.0) -> int:
    """Running + waiting requests in the engine, once zero (or at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        load = stub.GetLoads(vpb.GetLoadsRequest()).loads[0]
        busy = load.num_running_reqs + load.num_waiting_reqs
        if busy == 0 or time.monotonic() > deadline:
            return int(busy)
        time.sleep(0.1)


def test_generate_greedy_equals_the_in_process_engine(stub: Stub, tiny_model_dir: Path) -> None:
    [response] = generate(stub, "greedy", False, temperature=0.0, max_tokens=8, ignore_eos=True)
    done = response.complete
    assert list(done.output_ids) == greedy_in_process(tiny_model_dir, PROMPT_IDS, 8)[0]
    assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == \
        ("length", len(PROMPT_IDS), 8)


def test_streamed_chunks_add_up_to_the_unstreamed_output(stub: Stub) -> None:
    [whole] = generate(stub, "whole", False, temperature=0.0, max_tokens=6, ignore_eos=True)
    streamed = generate(stub, "streamed", True, temperature=0.0, max_tokens=6, ignore_eos=True)
    chunks = [r.chunk for r in streamed if r.HasField("chunk")]
    assert [t for c in chunks for t in c.token_ids] == list(whole.complete.output_ids)
    assert streamed[-1].HasField("complete")
    assert streamed[-1].complete.finish_reason == "length"


def test_n_two_streams_both_indices_each_with_its_complete(stub: Stub) -> None:
    responses = generate(stub, "n2", True, temperature=0.8, seed=7, n=2, max_tokens=4,
                         ignore_eos=True)
    completes = sorted(r.complete.index for r in responses if r.HasField("complete"))
    assert completes == [0, 1]
    for index in (0, 1):
        assert sum(len(r.chunk.token_ids) for r in responses
                   if r.HasField("chunk") and r.chunk.index == index) == 4


def test_stop_token_id_ends_with_matched_token(stub: Stub) -> None:
    [free] = generate(stub, "free", False, temperature=0.0, max_tokens=6, ignore_eos=True)
    stop_at = free.complete.output_ids[2]
    [stopped] = generate(stub, "stopped", False, temperature=0.0, max_tokens=6,
                         stop_token_ids=[stop_at])
    assert stopped.complete.finish_reason == "stop"
    assert stopped.complete.matched_token_id == stop_at


def test_logprobs_come_with_each_token(stub: Stub) -> None:
    [response] = generate(stub, "lp", False, temperature=0.0, max_tokens=3, logprobs=2)
    out = response.complete.output_logprobs
    assert list(out.token_ids) == list(response.complete.output_ids)
    assert [len(t.token_ids) for t in out.top_logprobs] == [2, 2, 2]


@pytest.mark.parametrize(("params", "field"), [
    ({"temperature": 5.0}, "sampling_params.temperature"),
    ({"top_p": 1.5}, "sampling_params.top_p"),
    ({"structural_tag": "{}"}, "sampling_params.structural_tag"),
])
def test_bad_sampling_params_are_invalid_argument_naming_the_field(
        stub: Stub, params: dict[str, Any], field: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        generate(stub, "bad", False, **params)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()


def test_empty_prompt_is_invalid_argument_naming_input_ids(stub: Stub) -> None:
    request = vpb.GenerateRequest(request_id="empty", tokenized=vpb.TokenizedInput())
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(request, timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tokenized.input_ids" in info.value.details()


def test_json_schema_constraint_gives_json(stub: Stub) -> None:
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'
    [response] = generate(stub, "json", False, temperature=0.0, max_tokens=24,
                          json_schema=schema)
    assert response.complete.finish_reason in ("stop", "length")
    assert response.complete.output_ids


def test_abort_by_the_callers_id_ends_the_request_in_the_engine(stub: Stub) -> None:
    request = vpb.GenerateRequest(request_id="to-abort",
                                  tokenized=vpb.TokenizedInput(input_ids=PROMPT_IDS),
                                  sampling_params=vpb.SamplingParams(max_tokens=1500,
                                                                     ignore_eos=True),
                                  stream=True)
    call = stub.Generate(request, timeout=120)
    first = next(call)
    assert first.HasField("chunk")
    stub.Abort(vpb.AbortRequest(request_ids=["to-abort"]))
    rest = list(call)
    assert not rest or rest[-1].complete.finish_reason == "abort"
    assert wait_idle(stub) == 0


def test_a_client_that_disconnects_leaves_nothing_running(stub: Stub) -> None:
    request = vpb.GenerateRequest(request_id="dropped",
                                  tokenized=vpb.TokenizedInput(input_ids=PROMPT_IDS),
                                  sampling_params=vpb.SamplingParams(max_tokens=1500,
                                                                     ignore_eos=True),
                                  stream=True)
    call = stub.Generate(request, timeout=120)
    next(call)
    call.cancel()
    assert wait_idle(stub) == 0


def test_embed_on_a_generation_stack_is_refused(stub: Stub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Embed(vpb.EmbedRequest(request_id="e", tokenized=vpb.TokenizedInput(
            input_ids=PROMPT_IDS)), timeout=30)
    assert info.value.code() != grpc.StatusCode.OK


def test_health_model_and_server_info(stub: Stub, tiny_model_dir: Path) -> None:
    assert stub.HealthCheck(vpb.HealthCheckRequest()).healthy
    model = stub.GetModelInfo(vpb.GetModelInfoRequest())
    assert (model.model_path, model.vocab_size, model.is_generation) == \
        (str(tiny_model_dir), 512, True)
    assert model.model_type == "llama" and model.max_context_length > 0
    server = stub.GetServerInfo(vpb.GetServerInfoRequest())
    assert server.server_type == "strand-vllm-grpc"
    assert server.block_size > 0


def test_get_loads_reports_one_rank_and_refuses_another(stub: Stub) -> None:
    loads = stub.GetLoads(vpb.GetLoadsRequest())
    assert loads.dp_rank_count == 1 and loads.loads[0].dp_rank == 0
    with pytest.raises(grpc.RpcError) as info:
        stub.GetLoads(vpb.GetLoadsRequest(dp_rank=3))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dp_rank" in info.value.details()


def test_flush_cache_when_idle_succeeds(stub: Stub) -> None:
    assert stub.FlushCache(cmn.FlushCacheRequest(timeout_s=5)).success


def test_flush_cache_with_a_bad_timeout_is_invalid_argument(stub: Stub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.FlushCache(cmn.FlushCacheRequest(timeout_s=-1))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timeout_s" in info.value.details()


def test_flush_cache_waits_for_idle_then_flushes(stub: Stub) -> None:
    request = vpb.GenerateRequest(request_id="busy",
                                  tokenized=vpb.TokenizedInput(input_ids=PROMPT_IDS),
                                  sampling_params=vpb.SamplingParams(max_tokens=40,
                                                                     ignore_eos=True))
    runner = threading.Thread(target=lambda: list(stub.Generate(request, timeout=120)))
    runner.start()
    time.sleep(0.3)
    assert stub.FlushCache(cmn.FlushCacheRequest(timeout_s=60)).success
    runner.join()


def test_get_tokenizer_streams_a_zip_with_its_sha256(stub: Stub) -> None:
    chunks = list(stub.GetTokenizer(cmn.GetTokenizerRequest()))
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    assert all(not c.sha256 for c in chunks[:-1])
    assert "tokenizer.json" in zipfile.ZipFile(io.BytesIO(data)).namelist()


def test_subscribe_kv_events_sends_load_first_then_stored_blocks(stub: Stub) -> None:
    call = stub.SubscribeKvEvents(cmn.SubscribeKvEventsRequest(
        load_records_before_first_batch=True), timeout=60)
    first = next(call)
    assert (first.sequence_number, first.load.load_only) == (0, True)
    generate(stub, "kv", False, temperature=0.0, max_tokens=40, ignore_eos=True)
    for batch in call:
        if any(e.HasField("stored") for e in batch.events):
            assert batch.sequence_number >= 1
            stored = next(e.stored for e in batch.events if e.HasField("stored"))
            assert stored.blocks[0].block_size > 0
            break
    call.cancel()


def test_start_profile_refuses_per_request_options_by_name(stub: Stub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.StartProfile(cmn.StartProfileRequest(output_dir="/tmp/x"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "output_dir" in info.value.details()


def test_start_and_stop_profile_write_a_trace(stub: Stub) -> None:
    assert stub.StartProfile(cmn.StartProfileRequest(), timeout=120).success
    generate(stub, "profiled", False, temperature=0.0, max_tokens=2)
    stopped = stub.StopProfile(cmn.StopProfileRequest(), timeout=120)
    assert stopped.success and "succeeded" in stopped.message
