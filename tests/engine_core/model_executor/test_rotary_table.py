"""The RoPE table holds the positions an engine can reach (its max_model_len), not every position
the model was trained for: the same rows, the same tokens, less memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from strand.engine_core.config import EngineArgs
from strand.engine_core.llm_engine import LLMEngine
from strand.engine_core.model_executor.layers.rotary_embedding import RotaryEmbedding
from strand.engine_core.sampling_params import SamplingParams
from strand.testing.tiny_model import LLAMA3_ROPE_SCALING

MAX_MODEL_LEN = 40


def table(positions: int | None) -> torch.Tensor:
    rotary = RotaryEmbedding(16, 256, 500000.0, {**LLAMA3_ROPE_SCALING,
                                                   "original_max_position_embeddings": 64})
    rotary.build_cache(torch.device("cpu"), positions)
    return rotary.cos_sin


def test_a_shorter_table_is_the_full_tables_first_rows() -> None:
    full = table(None)
    assert full.shape == (256, 16)
    torch.testing.assert_close(table(40), full[:40], rtol=0, atol=0)
    assert table(10_000).shape == (256, 16)  # never past the model's own positions


def test_a_table_of_no_positions_is_refused() -> None:
    with pytest.raises(ValueError, match="positions must be >= 1, got 0"):
        table(0)


def run(model_dir: Path, max_model_len: int | None) -> tuple[LLMEngine, list[int]]:
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(model_dir), dtype="float32",
                                                   max_model_len=max_model_len))
    engine.add_request("r", {"prompt_token_ids": list(range(3, 23))},
                       SamplingParams(temperature=0.0, max_tokens=MAX_MODEL_LEN))
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                assert isinstance(out.outputs, list)  # a completion, not a pooling output
                tokens = list(out.outputs[0].token_ids)
    return engine, tokens


def test_the_engine_builds_its_table_to_max_model_len_and_runs_to_its_end(
        tiny_model_dir: Path) -> None:
    engine, short = run(tiny_model_dir, MAX_MODEL_LEN)
    rotary = engine.engine_core.runner.model.model.rotary
    assert rotary.cos_sin.shape[0] == MAX_MODEL_LEN < rotary.max_positions
    # The request runs to the table's last row (prompt 20 + 20 = 40 positions) and decodes the
    # tokens of an engine with the model's whole table.
    assert len(short) == MAX_MODEL_LEN - 20
    _, full = run(tiny_model_dir, None)
    assert full[:len(short)] == short
