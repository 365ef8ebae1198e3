"""LoRA with tensor parallelism where a KV head is replicated on several ranks (its own module:
test_tp_lora.py keeps a TP=2 engine for its whole module, and a process holds one at a time)."""

from __future__ import annotations

from pathlib import Path

from strand.engine_core import LoRARequest
from tests.conftest import build_tiny_model
from tests.engine_core.distributed.conftest import LORA_ARGS, tp_engine
from tests.engine_core.lora.conftest import generate, make_peft_adapter


def test_tp2_lora_on_replicated_kv_heads_equals_tp1(tmp_path: Path,
                                                     tiny_model_dir: Path) -> None:
    """One KV head for two ranks: each rank holds all of k/v's B (the head is replicated),
    while q's and the MLP's B and o/down's A are split."""
    model_dir = build_tiny_model(tmp_path / "mistral", with_tokenizer=False, arch="mistral",
                                 num_heads=4, num_kv_heads=1)
    adapter = make_peft_adapter(model_dir, tmp_path / "adapter", seed=4)
    jobs = {"adapted": LoRARequest("kv1", 3, str(adapter)), "base": None}
    results = []
    for tp in (1, 2):
        with tp_engine(model_dir, tp, tokenizer=str(tiny_model_dir), **LORA_ARGS) as engine:
            results.append(generate(engine, jobs))
    assert results[1] == results[0]
    assert results[0]["adapted"] != results[0]["base"]
