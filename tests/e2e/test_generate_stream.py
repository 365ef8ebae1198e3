"""GenerateStream over the real ring (auto mode): many requests on one call with Generate's
outputs, refusals that leave the call open, a cancel that ends one request with "abort", a call
that goes away taking its requests with it, and EngineClient's generate() on one shared call."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import grpc
from opentelemetry.sdk.trace import TracerProvider

from engine_core.outputs import RequestOutput
from engine_core.sampling_params import RequestOutputKind, SamplingParams
from services._proto.strand.v1 import gateway_pb2 as gpb
from services._proto.strand.v1 import inference_pb2 as ipb
from services._proto.strand.v1 import inference_pb2_grpc
from services._proto.strand.v1 import types_pb2 as pb
from services.client import EngineClient, RequestError
from services.launch import Stack
from tests.e2e.conftest import API_KEY, engine_num_unfinished
from tests.e2e.otlp_receiver import OtlpReceiver

_AUTH = (("authorization", f"Bearer {API_KEY}"),)


class RawCall:
    """A GenerateStream call driven message by message."""

    def __init__(self, stack: Stack) -> None:
        self.channel = grpc.insecure_channel(stack.gateway_address)
        self.outgoing: queue.SimpleQueue[ipb.GenerateStreamRequest | None] = queue.SimpleQueue()
        stub = inference_pb2_grpc.InferenceStub(self.channel)
        self.call = stub.GenerateStream(iter(self.outgoing.get, None), metadata=_AUTH,
                                        timeout=120)

    def generate(self, rid: str, prompt: pb.Prompt, max_tokens: int,
                 ignore_eos: bool = True) -> None:
        self.outgoing.put(ipb.GenerateStreamRequest(generate=gpb.GenerateRequest(
            request_id=rid, prompt=prompt, params=pb.SamplingParams(
                temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos,
                output_kind=pb.DELTA))))

    def cancel(self, rid: str) -> None:
        self.outgoing.put(ipb.GenerateStreamRequest(cancel=rid))

    def __iter__(self) -> Iterator[ipb.GenerateStreamResponse]:
        return iter(self.call)

    def close(self) -> None:
        self.outgoing.put(None)
        self.channel.close()


def _text(text: str) -> pb.Prompt:
    return pb.Prompt(text=text)


def _wait_engine_empty(stack: Stack, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while engine_num_unfinished(stack) != 0:
        assert time.monotonic() < deadline, "the engine still holds the requests"
        time.sleep(0.05)


def test_requests_on_one_call_get_generates_tokens_and_the_call_ends_after_them(
        auto_stack: Stack, auto_client: EngineClient) -> None:
    prompts = {"p0": "The quick brown fox", "p1": "Once upon a time", "p2": "hello"}
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with EngineClient(auto_stack.gateway_address, api_key=API_KEY, timeout=60,
                      multiplex=False) as separate:
        expected = {rid: list(separate.generate(text, params))[-1].outputs[0].token_ids
                    for rid, text in prompts.items()}
    raw = RawCall(auto_stack)
    try:
        for rid, text in prompts.items():
            raw.generate(rid, _text(text), 8)
        raw.outgoing.put(None)  # half-closed: the outputs still come, then the end
        tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
        finished = []
        for response in raw:
            output = response.output
            tokens[output.request_id] += list(output.outputs[0].token_ids)
            if output.finished:
                finished.append(output.request_id)
        assert sorted(finished) == sorted(prompts)
        assert tokens == expected
        assert raw.call.code() == grpc.StatusCode.OK
    finally:
        raw.close()


def test_refused_requests_leave_the_call_open(auto_stack: Stack) -> None:
    raw = RawCall(auto_stack)
    try:
        responses = iter(raw)
        raw.generate("long", pb.Prompt(token_ids=pb.TokenIds(ids=[5] * 5000)), 4)
        refused = next(responses).refused
        assert refused.request_id == "long"
        assert refused.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "max_model_len" in refused.error.message
        raw.generate("", _text("no id"), 4)
        assert "request_id is required" in next(responses).refused.error.message
        raw.generate("ok", _text("still here"), 3)
        raw.generate("ok", _text("the same id again"), 3)
        seen = []
        for response in responses:
            kind = response.WhichOneof("kind")
            seen.append((kind, response.refused.error.code if kind == "refused" else None))
            if kind == "output" and response.output.finished:
                break
        assert ("refused", grpc.StatusCode.ALREADY_EXISTS.value[0]) in seen
        assert seen[-1] == ("output", None)
    finally:
        raw.close()
    _wait_engine_empty(auto_stack)


def test_cancel_ends_one_request_with_abort_and_not_the_other(auto_stack: Stack) -> None:
    raw = RawCall(auto_stack)
    try:
        raw.generate("stays", _text("a long one"), 40)
        raw.generate("goes", _text("another long one"), 400)
        reasons: dict[str, str] = {}
        cancelled = False
        for response in raw:
            output = response.output
            if output.request_id == "goes" and not cancelled:
                raw.cancel("goes")
                cancelled = True
            if output.finished:
                reasons[output.request_id] = output.outputs[0].finish_reason
                if len(reasons) == 2:
                    break
        assert reasons == {"goes": "abort", "stays": "length"}
    finally:
        raw.close()
    _wait_engine_empty(auto_stack)


def test_a_call_that_goes_away_takes_its_requests_with_it(auto_stack: Stack) -> None:
    raw = RawCall(auto_stack)
    responses = iter(raw)
    raw.generate("a", _text("first"), 2000)
    raw.generate("b", _text("second"), 2000)
    started: set[str] = set()
    while started != {"a", "b"}:
        started.add(next(responses).output.request_id)
    raw.call.cancel()
    raw.close()
    _wait_engine_empty(auto_stack)


def test_engine_client_generates_on_one_call_from_many_threads(
        auto_stack: Stack, auto_client: EngineClient) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    prompts = [f"prompt number {i}" for i in range(6)]
    with EngineClient(auto_stack.gateway_address, api_key=API_KEY, timeout=60,
                      multiplex=False) as separate:
        expected = [[t for out in separate.generate(p, params) for t in out.outputs[0].token_ids]
                    for p in prompts]
    got: dict[int, list[int]] = {}

    def run(i: int) -> None:
        got[i] = [t for out in auto_client.generate(prompts[i], params)
                  for t in out.outputs[0].token_ids]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [got[i] for i in range(len(prompts))] == expected
    assert auto_client._mux is not None and auto_client._mux.broken is None  # one call, open


def test_engine_client_closed_early_aborts_and_refusals_raise(
        auto_stack: Stack, auto_client: EngineClient) -> None:
    outputs: Iterator[RequestOutput] = auto_client.generate(
        "endless", SamplingParams(max_tokens=2000, ignore_eos=True), request_id="early")
    assert next(outputs).request_id == "early"
    outputs.close()  # type: ignore[attr-defined]
    _wait_engine_empty(auto_stack)
    try:
        list(auto_client.generate({"prompt_token_ids": [5] * 5000}, SamplingParams()))
    except RequestError as exc:
        assert exc.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_model_len" in str(exc)
    else:
        raise AssertionError("a prompt over max_model_len was taken")
    # The call is still the same one, and still serves.
    assert len(list(auto_client.generate("after", SamplingParams(max_tokens=2)))) >= 1


def test_each_request_on_the_shared_call_joins_its_own_callers_trace(
        auto_client: EngineClient, otlp_receiver: OtlpReceiver) -> None:
    tracer = TracerProvider().get_tracer("tests.e2e.test_generate_stream")
    callers = {}
    for rid in ("trace-a", "trace-b"):  # one call under both: each brings its own context
        with tracer.start_as_current_span(f"caller {rid}") as span:
            list(auto_client.generate("follow me", SamplingParams(max_tokens=2), request_id=rid))
            callers[rid] = span.get_span_context()
    for rid, caller in callers.items():
        (request,) = otlp_receiver.wait_for(
            lambda s, rid=rid: s.name == "llm_request"
            and s.attributes.get("gen_ai.request.id") == rid)
        assert request.trace_id == f"{caller.trace_id:032x}"
        (call,) = [s for s in otlp_receiver.trace(request.trace_id)
                   if s.span_id == request.parent_span_id]
        assert call.name == "strand.v1.Inference/GenerateStream"
        assert call.parent_span_id == f"{caller.span_id:016x}"
