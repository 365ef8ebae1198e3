"""The real SmolLM2-135M-Instruct GGUF served as a reranker the way vLLM serves Qwen3-Reranker
(hf_overrides: a *ForSequenceClassification whose score layer is the LM head's rows for
classifier_from_token): Strand's scores equal HF transformers' causal LM on the same file
(dequantized to float32 the same way), read as softmax over the tokens' logits at the last
position."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from strand.engine_core import LLM

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

QUERY = "Is Paris the capital of France? Answer yes or no."
DOCS = [" Paris is the capital of France.", " def fibonacci(n):\n    return n",
        " The Eiffel Tower is in Paris, which is the capital and largest city of France."]
RERANKER = {"architectures": ["LlamaForSequenceClassification"],
            "classifier_from_token": ["no", "yes"], "method": "from_2_way_softmax"}


def test_real_model_as_a_reranker_equals_hf_token_logits(smollm2_gguf: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                 dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    no, yes = (tokenizer.convert_tokens_to_ids(t) for t in ("no", "yes"))

    def last_logits(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model(torch.tensor([ids])).logits[0, -1].float()

    # 16-token chunks: every pair takes several steps.
    reranker = LLM(str(smollm2_gguf), runner="pooling", dtype="float32", hf_overrides=RERANKER,
                   max_num_batched_tokens=16)
    scores = reranker.score(QUERY, DOCS, use_tqdm=False)
    for doc, out in zip(DOCS, scores, strict=True):
        assert out.prompt_token_ids == tokenizer(QUERY, text_pair=doc)["input_ids"]
        want = last_logits(out.prompt_token_ids)[[no, yes]].softmax(-1)[1].item()
        # Measured on an AVX2 CPU: at most 1.5e-6 apart (float32 sums in another order).
        assert out.outputs.score == pytest.approx(want, abs=1e-5)
    # One label per token, each its logit: softmax over the three tokens.
    tokens = ["no", "yes", "maybe"]
    three = LLM(str(smollm2_gguf), runner="pooling", dtype="float32", hf_overrides={
        **RERANKER, "classifier_from_token": tokens, "method": "no_post_processing"})
    classified = three.classify(QUERY, use_tqdm=False)[0]
    rows = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    torch.testing.assert_close(torch.tensor(classified.outputs.probs),
                               last_logits(classified.prompt_token_ids)[rows].softmax(-1),
                               atol=1e-5, rtol=1e-4)
