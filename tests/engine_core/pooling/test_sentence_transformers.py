"""A sentence-transformers directory's modules.json sets the pooler as vLLM reads it (its
Pooling module's mode, a Normalize module), under the user's pooler_config; what the engine
does not run is refused by name. Embeddings against HF transformers' hidden states."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import LLM, EngineArgs, LLMEngine
from tests.engine_core.pooling.test_embed import expected

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling",
           "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"}


def st_model(tiny_model_dir: Path, into: Path, modules: list[dict[str, Any]],
             mode: str = "pooling_mode_mean_tokens", **pooling: Any) -> Path:
    model_dir = Path(shutil.copytree(tiny_model_dir, into))
    (model_dir / "modules.json").write_text(json.dumps(modules))
    (model_dir / "1_Pooling").mkdir()
    config = {"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
              "pooling_mode_mean_tokens": False, "pooling_mode_lasttoken": False, mode: True,
              **pooling}
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return model_dir


@pytest.mark.parametrize(("mode", "kind", "normalize"), [
    ("pooling_mode_mean_tokens", "MEAN", True), ("pooling_mode_cls_token", "CLS", False),
    ("pooling_mode_lasttoken", "LAST", True)])
def test_the_directory_sets_pooling_and_normalize(tiny_model_dir: Path, tmp_path: Path,
                                                  mode: str, kind: str,
                                                  normalize: bool) -> None:
    modules = [TRANSFORMER, POOLING, *([NORMALIZE] if normalize else [])]
    model_dir = st_model(tiny_model_dir, tmp_path / "st", modules, mode)
    llm = LLM(str(model_dir), device="cpu", runner="pooling", dtype="float32")
    ids = llm.get_tokenizer().encode("the quick brown fox")
    got = llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0].outputs.embedding
    torch.testing.assert_close(torch.tensor(got), expected(tiny_model_dir, ids, kind, normalize),
                               atol=2e-6, rtol=1e-5)


def test_the_users_pooler_config_wins(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = st_model(tiny_model_dir, tmp_path / "st", [TRANSFORMER, POOLING, NORMALIZE])
    llm = LLM(str(model_dir), device="cpu", runner="pooling", dtype="float32",
              pooler_config={"pooling_type": "LAST", "normalize": False})
    ids = [1, 5, 9, 13]
    got = llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0].outputs.embedding
    torch.testing.assert_close(torch.tensor(got), expected(tiny_model_dir, ids, "LAST", False),
                               atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(("modules", "pooling", "message"), [
    ([TRANSFORMER, POOLING, {"idx": 2, "name": "2", "path": "2_Dense",
                             "type": "sentence_transformers.models.Dense"}], {},
     "lists sentence_transformers.models.Dense \\(2_Dense\\), which this engine does not run"),
    ([TRANSFORMER, POOLING], {"pooling_mode_weightedmean_tokens": True},
     "asks for pooling_mode_weightedmean_tokens"),
    ([TRANSFORMER, POOLING], {"include_prompt": False}, "asks for include_prompt: false"),
    ([TRANSFORMER, POOLING], {"pooling_mode_cls_token": True},
     "exactly one of"),
])
def test_what_the_engine_does_not_run_is_refused_by_name(
        tiny_model_dir: Path, tmp_path: Path, modules: list[dict[str, Any]],
        pooling: dict[str, Any], message: str) -> None:
    model_dir = st_model(tiny_model_dir, tmp_path / "st", modules, **pooling)
    with pytest.raises(ValueError, match=message):
        LLMEngine.from_engine_args(EngineArgs(model=str(model_dir), device="cpu",
                                              runner="pooling"))
    # A generating engine reads no pooling modules.
    LLMEngine.from_engine_args(EngineArgs(model=str(model_dir), device="cpu")).shutdown()
