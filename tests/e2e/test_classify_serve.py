"""Sequence classifiers over real stacks started with --runner pooling: GetServerInfo names the
labels; a text pair sent as one prompt (text + text_pair) scores as LLM.score does in process;
vLLM's /classify, /score and /rerank (also /v1/score, /v1/rerank and /v2/rerank) answer with
the in-process figures; what a model cannot do, or a bad field, is a 400 naming it, and leaves
the engine holding nothing."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strand.engine_core import LLM, PoolingParams
from strand.services.client import EngineClient, RequestError
from strand.services.launch import Stack
from strand.testing.tiny_model import make_tiny_model
from tests.e2e.conftest import ENGINE_FLAGS, engine_num_unfinished, start_stack

FLAGS = ["--runner", "pooling", "--max-num-batched-tokens", "16"]
SENTIMENT = ("negative", "neutral", "positive")
QUERY = "what is a cat"
DOCS = ["a cat is a small animal", "paris is a city in france", "cats and dogs", "hello"]


def in_process(model_dir: Path) -> LLM:
    return LLM(str(model_dir), runner="pooling", max_num_batched_tokens=16,
               max_num_seqs=int(ENGINE_FLAGS[1]), kv_cache_memory=int(ENGINE_FLAGS[3]))


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("reranker"), "qwen3", labels=["relevant"],
                           seed=3)


@pytest.fixture(scope="module")
def reranker_stack(reranker_dir: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Stack]:
    with start_stack(reranker_dir, tmp_path_factory.mktemp("reranker-logs"), engine_args=FLAGS,
                     openai_port=0) as stack:
        yield stack


def post(stack: Stack, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://{stack.address('openai')}{path}", method="POST",
                                     headers={"Content-Type": "application/json"},
                                     data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def refused(stack: Stack, path: str, body: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(urllib.error.HTTPError) as error:
        post(stack, path, body)
    assert error.value.code == 400
    return json.loads(error.value.read())["error"]  # type: ignore[no-any-return]


def holds_nothing(stack: Stack) -> bool:
    deadline = time.monotonic() + 30
    while engine_num_unfinished(stack) and time.monotonic() < deadline:
        time.sleep(0.1)
    return engine_num_unfinished(stack) == 0


def test_reranker_scores_and_ranks_as_in_process(reranker_stack: Stack,
                                                 reranker_dir: Path) -> None:
    want = [out.outputs.score for out in in_process(reranker_dir).score(QUERY, DOCS,
                                                                          use_tqdm=False)]
    with EngineClient(reranker_stack.gateway_address, timeout=60) as client:
        assert client.get_server_info()["labels"] == ["relevant"]
        assert client.get_supported_tasks() == ("classify", "score")
        pair = client.embed({"prompt": QUERY, "text_pair": DOCS[0]}, PoolingParams(task="score"))
        assert pair.outputs.values[0] == pytest.approx(want[0], abs=1e-6)
    scored = post(reranker_stack, "/score", {"text_1": QUERY, "text_2": DOCS})
    assert [d["index"] for d in scored["data"]] == [0, 1, 2, 3]
    assert [d["score"] for d in scored["data"]] == pytest.approx(want, abs=1e-6)
    assert scored["usage"]["prompt_tokens"] > 0 and scored["object"] == "list"
    pairs = post(reranker_stack, "/v1/score", {"text_1": [QUERY] * 4, "text_2": DOCS})
    assert [d["score"] for d in pairs["data"]] == pytest.approx(want, abs=1e-6)
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        ranked = post(reranker_stack, path, {"query": QUERY, "documents": DOCS, "top_n": 2})
        assert [r["index"] for r in ranked["results"]] == order[:2]
        assert [r["document"]["text"] for r in ranked["results"]] == [DOCS[i] for i in order[:2]]
        assert [r["relevance_score"] for r in ranked["results"]] == pytest.approx(
            [want[i] for i in order[:2]], abs=1e-6)
    bare = post(reranker_stack, "/rerank", {"query": QUERY, "documents": DOCS,
                                            "return_documents": False})
    assert [r["index"] for r in bare["results"]] == order
    assert all(r["document"] is None for r in bare["results"])
    logits = post(reranker_stack, "/score", {"text_1": QUERY, "text_2": DOCS[0],
                                             "use_activation": False})
    assert logits["data"][0]["score"] == pytest.approx(
        in_process(reranker_dir).score(QUERY, DOCS[0], use_tqdm=False,
                                       pooling_params=PoolingParams(use_activation=False)
                                       )[0].outputs.score, abs=1e-5)


def test_reranker_refusals_name_the_field(reranker_stack: Stack) -> None:
    assert refused(reranker_stack, "/score", {"text_1": [QUERY, QUERY],
                                              "text_2": DOCS})["param"] == "text_2"
    assert refused(reranker_stack, "/rerank", {"query": QUERY, "documents": []})[
        "param"] == "documents"
    assert refused(reranker_stack, "/rerank", {"query": QUERY, "documents": DOCS,
                                               "top_n": -1})["param"] == "top_n"
    assert "at most 2048 items" in refused(reranker_stack, "/rerank", {
        "query": QUERY, "documents": ["d"] * 2049})["message"]
    # One empty document fails the request; the others already in the engine are taken back.
    assert "two non-empty strings" in refused(reranker_stack, "/rerank", {
        "query": QUERY, "documents": DOCS + [""]})["message"]
    assert "task 'embed' is not supported" in refused(reranker_stack, "/v1/embeddings", {
        "input": "hello"})["message"]
    assert holds_nothing(reranker_stack)


def test_classify_labels_and_refusals(tmp_path: Path) -> None:
    # A causal model served as a classifier by --hf-overrides (vLLM's flag): one label per
    # token of classifier_from_token, named by the overriding id2label.
    model_dir = make_tiny_model(tmp_path / "causal", "llama")
    overrides = {"architectures": ["LlamaForSequenceClassification"],
                 "classifier_from_token": ["a", "b", "c"], "method": "no_post_processing",
                 "id2label": dict(enumerate(SENTIMENT))}
    texts = ["the film was good", "awful"]
    llm = LLM(str(model_dir), runner="pooling", hf_overrides=overrides,
              max_num_batched_tokens=16, max_num_seqs=int(ENGINE_FLAGS[1]),
              kv_cache_memory=int(ENGINE_FLAGS[3]))
    want = [out.outputs.probs for out in llm.classify(texts, use_tqdm=False)]
    flags = [*FLAGS, "--hf-overrides", json.dumps(overrides)]
    with start_stack(model_dir, tmp_path / "logs", engine_args=flags, openai_port=0) as stack:
        answer = post(stack, "/classify", {"input": texts})
        for item, probs in zip(answer["data"], want, strict=True):
            assert item["probs"] == pytest.approx(probs, abs=1e-6)
            assert item["num_classes"] == 3
            assert item["label"] == SENTIMENT[probs.index(max(probs))]
        assert answer["usage"]["completion_tokens"] == 0
        assert "one label (a cross-encoder), this one has 3" in refused(
            stack, "/score", {"text_1": QUERY, "text_2": DOCS})["message"]
        with EngineClient(stack.gateway_address, timeout=60) as client:
            assert client.get_server_info()["labels"] == list(SENTIMENT)
            with pytest.raises(RequestError, match="normalize applies to task 'embed'"):
                client.embed("hi", PoolingParams(normalize=True))
        assert holds_nothing(stack)
