"""Embeddings over a real stack started with --runner pooling: AddRequest and Step give the
in-process engine's embeddings bit for bit (the same batches); the client's embed() and
/v1/embeddings through the official openai SDK (its default base64 encoding and plain floats)
give them within float32 rounding (other batches sum in another order). The wrong kind of
request is refused by name on either kind of server."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from strand.engine_core import LLM, PoolingParams, SamplingParams
from strand.engine_core.outputs import PoolingRequestOutput
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import gateway_pb2_grpc
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.client import EngineClient, RequestError
from strand.services.launch import Stack
from tests.e2e.conftest import ENGINE_FLAGS, engine_num_unfinished, start_stack

# A 16-token step budget: the longer prompts take several steps (chunked prefill).
POOLING_FLAGS = ["--runner", "pooling", "--max-num-batched-tokens", "16"]
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog and runs far away",
         "hello"]


def assert_close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want) == 64
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-6


@pytest.fixture(scope="module")
def pooling_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Stack]:
    """Manual stepping (no --auto-step): a Step, the client's embed() and the front each drive
    the engine themselves."""
    config_dir = tmp_path_factory.mktemp("pooling-stack-logs")
    with start_stack(tiny_model_dir, config_dir, engine_args=POOLING_FLAGS,
                     openai_port=0) as stack:
        yield stack


@pytest.fixture(scope="module")
def in_process(tiny_model_dir: Path) -> dict[str, list[float]]:
    """Each text's embedding from the in-process engine with the stack's flags."""
    llm = LLM(str(tiny_model_dir), runner="pooling", max_num_batched_tokens=16,
              max_num_seqs=int(ENGINE_FLAGS[1]), kv_cache_memory=int(ENGINE_FLAGS[3]))
    return {text: out.outputs.embedding
            for text, out in zip(TEXTS, llm.embed(TEXTS, use_tqdm=False), strict=True)}


def test_add_request_and_step_return_the_in_process_embeddings(
        pooling_stack: Stack, in_process: dict[str, list[float]]) -> None:
    with EngineClient(pooling_stack.gateway_address, timeout=60) as client:
        for i, text in enumerate(TEXTS):
            client.add_request(str(i), text, PoolingParams())
        done: dict[str, PoolingRequestOutput] = {}
        while client.has_unfinished_requests():
            for out in client.step():
                assert isinstance(out, PoolingRequestOutput) and out.finished
                done[out.request_id] = out
        assert sorted(done) == ["0", "1", "2"]
        for i, text in enumerate(TEXTS):
            assert done[str(i)].outputs.values == in_process[text]  # float32 both ways: exact
        one = client.embed(TEXTS[1])
        assert_close(one.outputs.values, in_process[TEXTS[1]])
        assert one.prompt_token_ids == done["1"].prompt_token_ids
        assert client.get_num_unfinished_requests() == 0


def test_a_pooling_server_refuses_sampling_params_by_name(pooling_stack: Stack) -> None:
    with EngineClient(pooling_stack.gateway_address, timeout=60) as client:
        with pytest.raises(RequestError, match="params must be a PoolingParams"):
            client.add_request("g", "hello", SamplingParams(max_tokens=4))
        assert not client.has_unfinished_requests()
    # dimensions on a model not trained for matryoshka widths: refused by the engine, by name.
    with grpc.insecure_channel(pooling_stack.gateway_address) as channel:
        msg = gpb.AddRequestRequest(request_id="d", prompt=pb.Prompt(text="hello"),
                                    pooling_params=pb.PoolingParams(dimensions=4))
        with pytest.raises(grpc.RpcError) as refused:
            gateway_pb2_grpc.GatewayStub(channel).AddRequest(msg, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "dimensions" in refused.value.details()  # type: ignore[attr-defined]


def test_openai_sdk_embeddings(pooling_stack: Stack,
                               in_process: dict[str, list[float]]) -> None:
    base = f"http://{pooling_stack.address('openai')}/v1"
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as sdk:
        model = sdk.models.list().data[0].id
        # The SDK asks for base64 by default and decodes it back to floats.
        resp = sdk.embeddings.create(model=model, input=TEXTS)
        assert [d.index for d in resp.data] == [0, 1, 2]
        for text, item in zip(TEXTS, resp.data, strict=True):
            assert_close(item.embedding, in_process[text])
        plain = sdk.embeddings.create(model=model, input=TEXTS[0], encoding_format="float")
        assert_close(plain.data[0].embedding, in_process[TEXTS[0]])
        with EngineClient(pooling_stack.gateway_address, timeout=60) as client:
            ids = client.tokenize(TEXTS[2])["tokens"]
        by_ids = sdk.embeddings.create(model=model, input=[ids, ids[:1]],
                                       encoding_format="float")
        assert_close(by_ids.data[0].embedding, in_process[TEXTS[2]])
        assert by_ids.usage.prompt_tokens == len(ids) + 1 == by_ids.usage.total_tokens
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.embeddings.create(model=model, input="hello", dimensions=8)
        assert refused.value.body["param"] == "dimensions"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError, match="prompt must not be empty"):
            sdk.embeddings.create(model=model, input=["hello", ""])
        with pytest.raises(openai.BadRequestError, match="at most 2048 items, got 2049"):
            sdk.embeddings.create(model=model, input=["hi"] * 2049)
    # vLLM's chat form: the conversation as the model's template renders it.
    chat = [{"role": "user", "content": "hello"}]
    with urllib.request.urlopen(urllib.request.Request(
            f"{base}/embeddings", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"model": model, "messages": chat}).encode()), timeout=60) as resp:
        answer = json.loads(resp.read())
    with EngineClient(pooling_stack.gateway_address, timeout=60) as client:
        rendered = client.tokenize({"messages": chat, "add_generation_prompt": False})
        assert_close(answer["data"][0]["embedding"],
                     client.embed({"prompt_token_ids": rendered["tokens"]}).outputs.values)
    assert answer["usage"]["prompt_tokens"] == rendered["count"]
    with pytest.raises(urllib.error.HTTPError) as both:
        urllib.request.urlopen(urllib.request.Request(
            f"{base}/embeddings", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"input": "hi", "messages": chat}).encode()), timeout=60)
    assert both.value.code == 400 and b"exactly one of input and messages" in both.value.read()
    # The refused request's other input was taken back: the engine holds nothing.
    deadline = time.monotonic() + 30
    while engine_num_unfinished(pooling_stack) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine_num_unfinished(pooling_stack) == 0


def test_a_generating_server_refuses_embeddings_by_name(stack: Stack) -> None:
    with EngineClient(stack.gateway_address, timeout=60) as client:
        with pytest.raises(RequestError, match="runner='pooling'"):
            client.embed("hello")
        assert client.get_num_unfinished_requests() == 0


def test_an_embedding_server_scores_and_reranks_by_cosine(pooling_stack: Stack,
                                                          tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), runner="pooling", max_num_batched_tokens=16,
              max_num_seqs=int(ENGINE_FLAGS[1]), kv_cache_memory=int(ENGINE_FLAGS[3]))
    want = [out.outputs.score for out in llm.score(TEXTS[0], TEXTS, use_tqdm=False)]
    assert want[0] == pytest.approx(1.0, abs=1e-6)  # a text against itself

    def post(path: str, body: dict[str, object]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://{pooling_stack.address('openai')}{path}", method="POST",
            headers={"Content-Type": "application/json"}, data=json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=60) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    scored = post("/score", {"text_1": TEXTS[0], "text_2": TEXTS})
    assert [d["score"] for d in scored["data"]] == pytest.approx(want, abs=1e-5)
    ranked = post("/rerank", {"query": TEXTS[0], "documents": TEXTS})
    assert [r["index"] for r in ranked["results"]] == sorted(range(3), key=lambda i: -want[i])
    with pytest.raises(urllib.error.HTTPError) as refused:
        post("/classify", {"input": "hello"})
    assert refused.value.code == 400
    assert b"needs a sequence classifier" in refused.value.read()
