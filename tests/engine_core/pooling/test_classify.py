"""Sequence classifiers (*ForSequenceClassification, runner="pooling") against HF
transformers' AutoModelForSequenceClassification on the same weights: LLM.classify's
probabilities, the raw logits, and LLM.score's cross-encoder scores, with chunked prefill,
prefix-cache hits and preemption on; LLM.score of an embedding model against HF's cosine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import LLM, EngineArgs, LLMEngine, PoolingParams
from strand.engine_core.outputs import PoolingRequestOutput
from strand.testing.tiny_model import make_tiny_model
from tests.engine_core.pooling.test_embed import PROMPTS, embed_all, expected

SENTIMENT = ("negative", "neutral", "positive")
QUERY = "what is a cat"
DOCS = ["a cat is a small animal", "paris is a city in france", "cats and dogs"]


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("llama-cls"), "llama", labels=SENTIMENT)


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Its config keeps the base model's tie_word_embeddings, as converted rerankers do: the
    # score layer is its own all the same.
    return make_tiny_model(tmp_path_factory.mktemp("qwen3-rerank"), "qwen3", labels=["yes"],
                           seed=3, tie_word_embeddings=True)


_HF: dict[Path, Any] = {}


def hf_logits(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForSequenceClassification

    if model_dir not in _HF:
        _HF[model_dir] = AutoModelForSequenceClassification.from_pretrained(
            model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return _HF[model_dir](torch.tensor([token_ids])).logits[0].float()


def engine_for(model_dir: Path, **kwargs: Any) -> LLMEngine:
    return LLMEngine.from_engine_args(EngineArgs(model=str(model_dir), device="cpu",
                                                 runner="pooling", dtype="float32", **kwargs))


def test_probabilities_equal_hf_with_chunks_cache_and_preemption(classifier_dir: Path) -> None:
    # 16-token chunks, then the same prompts again (their blocks cached), then all at once
    # in a pool too small for them (preemption).
    engine = engine_for(classifier_dir, max_num_batched_tokens=16, max_num_seqs=4)
    rounds = [embed_all(engine, PROMPTS), embed_all(engine, PROMPTS)]
    # Four 49-token prompts advance 8 tokens a step side by side in 8 usable blocks.
    small = engine_for(classifier_dir, max_num_batched_tokens=32, long_prefill_token_threshold=8,
                       num_gpu_blocks_override=9)
    preempted = [list(range(1 + i, 50 + i)) for i in range(4)]
    rounds.append(embed_all(small, preempted))
    assert small.engine_core.scheduler.make_stats().num_preemptions > 0
    for i, ids in enumerate(PROMPTS):
        want = hf_logits(classifier_dir, ids).softmax(-1)
        for done in rounds[:2]:
            got = done[str(i)].outputs.data
            assert got.shape == (3,)
            torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    assert max(rounds[1][str(i)].num_cached_tokens for i in range(len(PROMPTS))) >= 32
    for i, ids in enumerate(preempted):
        torch.testing.assert_close(rounds[2][str(i)].outputs.data,
                                   hf_logits(classifier_dir, ids).softmax(-1),
                                   atol=2e-6, rtol=1e-5)
    pool = small.engine_core.scheduler.kv_cache_manager.block_pool
    assert pool.free_block_queue.num_free_blocks == pool.num_blocks - 1  # nothing leaked


def test_llm_classify_in_prompt_order_and_raw_logits(classifier_dir: Path) -> None:
    llm = LLM(str(classifier_dir), device="cpu", runner="pooling", dtype="float32")
    texts = ["the film was good", "awful", "it rained on tuesday"]
    outputs = llm.classify(texts, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    for text, out in zip(texts, outputs, strict=True):
        ids = tokenizer.encode(text)
        assert out.prompt_token_ids == ids and out.outputs.num_classes == 3
        torch.testing.assert_close(torch.tensor(out.outputs.probs),
                                   hf_logits(classifier_dir, ids).softmax(-1),
                                   atol=2e-6, rtol=1e-5)
    raw = llm.classify(texts[0], PoolingParams(use_activation=False), use_tqdm=False)[0]
    torch.testing.assert_close(torch.tensor(raw.outputs.probs),
                               hf_logits(classifier_dir, tokenizer.encode(texts[0])),
                               atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "phi3", "gemma2"])
def test_every_family_classifies_as_hf(tmp_path: Path, arch: str) -> None:
    model_dir = make_tiny_model(tmp_path / arch, arch, labels=("a", "b"))
    engine = engine_for(model_dir)
    ids = [1, 5, 9, 13, 200, 7, 7]
    got = embed_all(engine, [ids])["0"].outputs.data
    torch.testing.assert_close(got, hf_logits(model_dir, ids).softmax(-1), atol=2e-6, rtol=1e-5)


def test_cross_encoder_scores_equal_hf_on_the_pair_template(cross_encoder_dir: Path) -> None:
    from transformers import AutoTokenizer

    llm = LLM(str(cross_encoder_dir), device="cpu", runner="pooling", dtype="float32",
              max_num_batched_tokens=16)
    hf_tokenizer = AutoTokenizer.from_pretrained(cross_encoder_dir)
    one_to_many = llm.score(QUERY, DOCS, use_tqdm=False)
    many = llm.score([QUERY] * 3, DOCS, use_tqdm=False)
    assert len(one_to_many) == len(many) == 3
    for doc, out, again in zip(DOCS, one_to_many, many, strict=True):
        ids = hf_tokenizer(QUERY, text_pair=doc)["input_ids"]
        assert out.prompt_token_ids == ids
        want = hf_logits(cross_encoder_dir, ids).sigmoid().item()
        assert out.outputs.score == pytest.approx(want, abs=2e-6)
        assert again.outputs.score == pytest.approx(want, abs=2e-6)
    assert len({round(out.outputs.score, 6) for out in one_to_many}) == 3  # they differ
    logit = llm.score(QUERY, DOCS[0], pooling_params=PoolingParams(use_activation=False),
                      use_tqdm=False)[0].outputs.score
    ids = hf_tokenizer(QUERY, text_pair=DOCS[0])["input_ids"]
    assert logit == pytest.approx(hf_logits(cross_encoder_dir, ids).item(), abs=2e-6)
    with pytest.raises(ValueError, match="1:1, 1:N or N:N"):
        llm.score([QUERY, QUERY], DOCS, use_tqdm=False)
    with pytest.raises(ValueError, match="data_2 must not be empty"):
        llm.score(QUERY, [], use_tqdm=False)
    with pytest.raises(ValueError, match="must be strings"):
        llm.score(QUERY, {"prompt_token_ids": [1, 2]}, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_an_embedding_model_scores_by_cosine_similarity(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), device="cpu", runner="pooling", dtype="float32")
    tokenizer = llm.get_tokenizer()
    outputs = llm.score(QUERY, DOCS, use_tqdm=False)
    query = expected(tiny_model_dir, tokenizer.encode(QUERY), "LAST", True)
    for doc, out in zip(DOCS, outputs, strict=True):
        ids = tokenizer.encode(doc)
        want = torch.nn.functional.cosine_similarity(
            query, expected(tiny_model_dir, ids, "LAST", True), dim=0).item()
        assert out.outputs.score == pytest.approx(want, abs=1e-5)
        assert out.prompt_token_ids == tokenizer.encode(QUERY) + ids


def test_the_wrong_task_is_refused_by_name_and_changes_nothing(classifier_dir: Path,
                                                                 cross_encoder_dir: Path,
                                                                 tiny_model_dir: Path) -> None:
    engine = engine_for(classifier_dir)
    assert engine.get_supported_tasks() == ("classify",)
    assert engine_for(cross_encoder_dir).get_supported_tasks() == ("classify", "score")
    refusals = [(PoolingParams(task="embed"), "task 'embed' is not supported by this model"),
                (PoolingParams(task="score"), "one label \\(a cross-encoder\\), this one has 3")]
    for params, message in refusals:
        with pytest.raises(ValueError, match=message):
            engine.add_request("r", {"prompt_token_ids": [1, 2]}, params)
        assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="normalize applies to task 'embed'"):
        PoolingParams(task="classify", normalize=True)
    with pytest.raises(ValueError, match="use_activation applies to task 'classify'"):
        PoolingParams(task="embed", use_activation=False)
    with pytest.raises(ValueError, match="task must be one of"):
        PoolingParams(task="reward")
    # A classifier's normalize left to the engine is refused when it is named.
    with pytest.raises(ValueError, match="normalize applies to task 'embed', not 'classify'"):
        engine.add_request("n", {"prompt_token_ids": [1, 2]}, PoolingParams(normalize=True))
    done = embed_all(engine, [[1, 2]])  # the engine still classifies
    assert isinstance(done["0"], PoolingRequestOutput) and len(done["0"].outputs.values) == 3
    embedder = engine_for(tiny_model_dir)
    assert embedder.get_supported_tasks() == ("embed",)
    with pytest.raises(ValueError, match="needs a sequence classifier"):
        embedder.add_request("c", {"prompt_token_ids": [1, 2]}, PoolingParams(task="classify"))
    with pytest.raises(ValueError, match="sequence classifier \\(1 labels.*runner='pooling'"):
        LLMEngine.from_engine_args(EngineArgs(model=str(cross_encoder_dir), device="cpu"))


def test_labels_come_from_id2label_or_num_labels(tmp_path: Path) -> None:
    from strand.engine_core.model_executor.seq_cls import labels_of

    assert labels_of({"id2label": {"1": "b", "0": "a"}}) == ("a", "b")
    assert labels_of({"num_labels": 3}) == ("LABEL_0", "LABEL_1", "LABEL_2")
    assert labels_of({}) == ("LABEL_0", "LABEL_1")  # transformers' default
    with pytest.raises(ValueError, match="id2label keys must be 0..1"):
        labels_of({"id2label": {"0": "a", "2": "b"}})
    with pytest.raises(ValueError, match="num_labels must be an integer >= 1"):
        labels_of({"num_labels": 0})


def hf_causal_last_logits(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([token_ids])).logits[0, -1].float()


@pytest.mark.parametrize("tied", [False, True])
def test_a_causal_model_scores_from_its_head_rows(tmp_path: Path, tied: bool) -> None:
    # vLLM's hf_overrides for a causal reranker: the score layer is the LM head's rows (the
    # embedding table's, tied) for classifier_from_token, as Qwen3-Reranker is served.
    model_dir = make_tiny_model(tmp_path / "causal", "qwen3", tie_word_embeddings=tied)
    overrides: dict[str, Any] = {"architectures": ["Qwen3ForSequenceClassification"],
                                 "classifier_from_token": ["a", "b"],
                                 "method": "from_2_way_softmax"}
    llm = LLM(str(model_dir), device="cpu", runner="pooling", dtype="float32",
              hf_overrides=overrides, max_num_batched_tokens=16)
    a, b, c = (llm.get_tokenizer().backend.token_to_id(t) for t in "abc")
    out = llm.score(QUERY, DOCS[0], use_tqdm=False)[0]
    logits = hf_causal_last_logits(model_dir, out.prompt_token_ids)
    assert out.outputs.score == pytest.approx(logits[[a, b]].softmax(-1)[1].item(), abs=2e-6)
    three = LLM(str(model_dir), device="cpu", runner="pooling", dtype="float32", hf_overrides={
        **overrides, "classifier_from_token": ["a", "b", "c"], "method": "no_post_processing"})
    probs = three.classify(QUERY, use_tqdm=False)[0]
    torch.testing.assert_close(
        torch.tensor(probs.outputs.probs),
        hf_causal_last_logits(model_dir, probs.prompt_token_ids)[[a, b, c]].softmax(-1),
        atol=2e-6, rtol=1e-5)


def test_bad_classifier_from_token_overrides_are_refused_by_name(tiny_model_dir: Path) -> None:
    base: dict[str, Any] = {"architectures": ["LlamaForSequenceClassification"],
                            "classifier_from_token": ["a"], "method": "no_post_processing"}
    refusals: list[tuple[dict[str, Any], str]] = [({**base, "classifier_from_token": ["a", "zzzq"]},
                 "classifier_from_token 'zzzq' is not a token"),
                ({**base, "method": None}, "method must be one of"),
                ({**base, "method": "from_2_way_softmax"}, "needs two classifier_from_token"),
                ({**base, "classifier_from_token": []}, "must be a non-empty list")]
    for overrides, message in refusals:
        with pytest.raises(ValueError, match=message):
            LLMEngine.from_engine_args(EngineArgs(model=str(tiny_model_dir), device="cpu",
                                                  runner="pooling", hf_overrides=overrides))


@pytest.mark.parametrize(("activation_fn", "apply"), [
    ("torch.nn.modules.linear.Identity", lambda logits: logits),
    ("torch.nn.modules.activation.Sigmoid", torch.sigmoid)])
def test_a_cross_encoders_activation_fn_is_applied(tmp_path: Path, activation_fn: str,
                                                   apply: Any) -> None:
    # sentence-transformers' CrossEncoder config (vLLM honours it): here over three labels.
    model_dir = make_tiny_model(tmp_path / "ce", "llama", labels=SENTIMENT, extra_config={
        "sentence_transformers": {"activation_fn": activation_fn}})
    engine = engine_for(model_dir)
    ids = [1, 5, 9, 13]
    got = embed_all(engine, [ids])["0"].outputs.data
    torch.testing.assert_close(got, apply(hf_logits(model_dir, ids)), atol=2e-6, rtol=1e-5)


def test_an_activation_fn_not_applied_here_is_refused(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "ce", "llama", labels=SENTIMENT, extra_config={
        "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}})
    with pytest.raises(ValueError, match="activation_fn must be Sigmoid, Softmax or Identity"):
        engine_for(model_dir)
