"""LoRA with tensor parallelism: TP=2 (gloo, two ranks, one thread each) gives TP=1's greedy
tokens, and transformers' on the PEFT-merged model, for a batch mixing two adapters and the
base model; add / pin / remove reach the worker rank (its own manager, asked by
collective_rpc)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from strand.engine_core import LLMEngine, LoRARequest
from strand.engine_core.lora.manager import LoRAManager
from strand.engine_core.model_executor.model_runner import ModelRunner
from tests.engine_core.distributed.conftest import LORA_ARGS, tp_engine
from tests.engine_core.engine.conftest import run_to_completion
from tests.engine_core.lora.conftest import (
    GREEDY,
    PROMPT,
    generate,
    hf_merged_greedy,
    make_peft_adapter,
    write_config,
)


def _manager(runner: ModelRunner) -> LoRAManager:
    assert runner.lora_manager is not None
    return runner.lora_manager


def loaded_loras(runner: ModelRunner) -> list[int]:
    """Run on every rank by collective_rpc: the adapters its own manager holds."""
    return sorted(_manager(runner).list_loras())


def lru_order(runner: ModelRunner) -> list[int]:
    """Run on every rank by collective_rpc: its loaded adapters, least recently used first."""
    return list(_manager(runner).loaded)


def pinned_loras(runner: ModelRunner) -> list[int]:
    """Run on every rank by collective_rpc: the adapters its manager keeps pinned."""
    return sorted(_manager(runner).pinned)


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, LoRARequest]:
    """Every target (r=8), and q/v only (r=4, rsLoRA): both kinds of parallel layer, fused
    slices of unequal width (q vs the KV heads each rank holds)."""
    root = tmp_path_factory.mktemp("tp-adapters")
    every = make_peft_adapter(tiny_model_dir, root / "all", seed=1)
    qv = make_peft_adapter(tiny_model_dir, root / "qv", seed=2, r=4, alpha=8,
                           targets=["q_proj", "v_proj"], use_rslora=True)
    return {"all": LoRARequest("all", 1, str(every)), "qv": LoRARequest("qv", 2, str(qv))}


@pytest.fixture(scope="module")
def tp2(tiny_model_dir: Path) -> Iterator[LLMEngine]:
    with tp_engine(tiny_model_dir, 2, **LORA_ARGS) as engine:
        yield engine


def test_tp2_mixed_adapter_batch_equals_tp1_and_hf(tiny_model_dir: Path,
                                                   adapters: dict[str, LoRARequest],
                                                   tp2: LLMEngine) -> None:
    jobs = {"all": adapters["all"], "base": None, "qv": adapters["qv"]}
    with tp_engine(tiny_model_dir, 1, **LORA_ARGS) as tp1:
        single = generate(tp1, jobs)
    sharded = generate(tp2, jobs)
    assert sharded == single
    assert sharded["all"] == hf_merged_greedy(tiny_model_dir, Path(adapters["all"].lora_path),
                                              PROMPT, 10)
    # The adapters change the output (else equal tokens prove nothing about their shards).
    assert sharded["all"] != sharded["base"] and sharded["qv"] != sharded["base"]


def test_tp2_add_pin_remove_reach_the_worker_rank(adapters: dict[str, LoRARequest],
                                                  tp2: LLMEngine) -> None:
    for lora_id in list(tp2.list_loras()):
        tp2.remove_lora(lora_id)
    assert tp2.collective_rpc(loaded_loras) == [[], []]
    assert tp2.add_lora(adapters["all"]) and tp2.add_lora(adapters["qv"])
    assert tp2.collective_rpc(loaded_loras) == [[1, 2], [1, 2]]
    assert tp2.pin_lora(1)
    assert tp2.collective_rpc(pinned_loras) == [[1], [1]]
    before = generate(tp2, {"qv": adapters["qv"]})["qv"]
    assert tp2.remove_lora(2) is True
    assert tp2.remove_lora(2) is False  # vLLM: False for one not loaded
    assert tp2.collective_rpc(loaded_loras) == [[1], [1]]
    # A request whose adapter was removed reloads it on every rank, with the same result.
    tp2.reset_prefix_cache()
    assert generate(tp2, {"again": adapters["qv"]})["again"] == before
    assert tp2.collective_rpc(loaded_loras) == [[1, 2], [1, 2]]


def test_tp2_bad_adapter_is_refused_on_every_rank(adapters: dict[str, LoRARequest],
                                                  tmp_path: Path, tiny_model_dir: Path,
                                                  tp2: LLMEngine) -> None:
    bad = make_peft_adapter(tiny_model_dir, tmp_path / "r16", seed=3, r=16, alpha=16)
    before = tp2.collective_rpc(loaded_loras)
    with pytest.raises(ValueError, match=r"r \(16\) must be <= max_lora_rank \(8\)"):
        tp2.add_lora(LoRARequest("r16", 7, str(bad)))
    write_config(bad, r=8)  # now rank 0 accepts the config, but the tensors are r=16
    with pytest.raises(ValueError, match="lora_A must be"):
        tp2.add_lora(LoRARequest("r16", 7, str(bad)))
    assert tp2.collective_rpc(loaded_loras) == before



def set_worker_max_lora_rank(runner: ModelRunner, max_lora_rank: int) -> None:
    """collective_rpc: a worker rank's own limit (rank 0 keeps the engine's)."""
    if runner.tp is not None and not runner.tp.is_driver:
        manager = _manager(runner)
        manager.config = dataclasses.replace(manager.config, max_lora_rank=max_lora_rank)


def test_tp2_adapter_a_worker_refuses_is_removed_on_every_rank(
        adapters: dict[str, LoRARequest], tp2: LLMEngine) -> None:
    """Rank 0 loads it, rank 1 cannot (its limit lowered to r=4 here): add_lora raises naming
    rank 1 and no rank keeps the adapter."""
    for lora_id in list(tp2.list_loras()):
        tp2.remove_lora(lora_id)
    tp2.collective_rpc(set_worker_max_lora_rank, args=(4,))
    try:
        with pytest.raises(ValueError, match=r"add_lora failed on rank 1: ValueError: r \(8\)"):
            tp2.add_lora(adapters["all"])
        assert tp2.collective_rpc(loaded_loras) == [[], []]
        assert tp2.add_lora(adapters["qv"])  # r=4: every rank takes it
        assert tp2.collective_rpc(loaded_loras) == [[2], [2]]
    finally:
        tp2.collective_rpc(set_worker_max_lora_rank, args=(LORA_ARGS["max_lora_rank"],))


def test_tp2_requests_move_their_adapter_up_the_lru_on_every_rank(
        adapters: dict[str, LoRARequest], tp2: LLMEngine) -> None:
    """A request's adapter, already loaded, becomes the most recently used on rank 0 at once
    (no collective per request) and on the workers before the next mirrored call or step: so
    a fourth adapter (max_cpu_loras=3) unloads the same one everywhere."""
    for lora_id in list(tp2.list_loras()):
        tp2.remove_lora(lora_id)
    path = adapters["qv"].lora_path
    for lora_id in (1, 2, 3):
        tp2.add_lora(LoRARequest(f"a{lora_id}", lora_id, path))
    tp2.add_request("touch", {"prompt_token_ids": PROMPT}, GREEDY,
                    lora_request=LoRARequest("a1", 1, path))
    tp2.abort_request(["touch"])
    tp2.add_lora(LoRARequest("a4", 4, path))  # unloads the least recently used: 2
    assert tp2.collective_rpc(lru_order) == [[3, 1, 4], [3, 1, 4]]
    tp2.add_request("touch-3", {"prompt_token_ids": PROMPT}, GREEDY,
                    lora_request=LoRARequest("a3", 3, path))
    tp2.abort_request(["touch-3"])
    tp2.add_request("base", {"prompt_token_ids": PROMPT}, GREEDY)
    run_to_completion(tp2)  # its steps carry the touch of 3 (and use no adapter)
    assert tp2.collective_rpc(lru_order) == [[1, 4, 3], [1, 4, 3]]
