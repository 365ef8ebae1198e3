"""Embeddings under tensor parallelism: every rank runs its shard of the forward and rank 0,
which holds the all-reduced hidden states, pools them; TP=2 gives TP=1's embeddings. A
classifier's score layer stays whole on every rank: TP=2 gives TP=1's probabilities."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import PoolingParams
from strand.testing.tiny_model import make_tiny_model
from tests.conftest import build_tiny_model
from tests.engine_core.distributed.conftest import tp_engine
from tests.engine_core.pooling.test_embed import PROMPTS, embed_all


def test_tp2_embeddings_equal_tp1(tmp_path: Path, tiny_model_dir: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "llama", with_tokenizer=False)
    results = {}
    for tp in (1, 2):
        with tp_engine(model_dir, tp, tokenizer=str(tiny_model_dir), runner="pooling",
                       max_num_batched_tokens=16,
                       pooler_config={"pooling_type": "MEAN"}) as engine:
            results[tp] = embed_all(engine, PROMPTS, PoolingParams())
    assert sorted(results[2]) == sorted(results[1])
    for key, out in results[2].items():
        torch.testing.assert_close(out.outputs.data, results[1][key].outputs.data,
                                   atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("from_tokens", [False, True])
def test_tp2_classifier_probabilities_equal_tp1(tmp_path: Path, tiny_model_dir: Path,
                                                from_tokens: bool) -> None:
    # A classifier checkpoint's score layer, or one made of a causal model's LM head rows
    # (classifier_from_token): either is read whole on every rank.
    overrides: dict[str, Any] = {}
    if from_tokens:
        model_dir = make_tiny_model(tmp_path / "causal", "llama", with_tokenizer=False)
        overrides = {"hf_overrides": {"architectures": ["LlamaForSequenceClassification"],
                                      "classifier_from_token": ["a", "b", "c"],
                                      "method": "no_post_processing"}}
    else:
        model_dir = make_tiny_model(tmp_path / "cls", "llama", labels=("a", "b", "c"),
                                    with_tokenizer=False)
    results = {}
    for tp in (1, 2):
        with tp_engine(model_dir, tp, tokenizer=str(tiny_model_dir), runner="pooling",
                       max_num_batched_tokens=16, **overrides) as engine:
            results[tp] = embed_all(engine, PROMPTS, PoolingParams(task="classify"))
    assert sorted(results[2]) == sorted(results[1])
    for key, out in results[2].items():
        assert len(out.outputs.values) == 3
        torch.testing.assert_close(out.outputs.data, results[1][key].outputs.data,
                                   atol=1e-5, rtol=1e-4)
