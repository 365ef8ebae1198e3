"""LoRA through LLMEngine: HF-exact against PEFT-merged weights, mixed batches, the prefix
cache, and vLLM's add_lora / remove_lora / list_loras / pin_lora."""

from __future__ import annotations

from pathlib import Path

import pytest

from strand.engine_core import LLMEngine, LoRARequest
from tests.engine_core.engine.conftest import run_to_completion
from tests.engine_core.lora.conftest import (
    GREEDY,
    PROMPT,
    generate,
    hf_merged_greedy,
    make_lora_engine,
)


def lora(name: str, lora_id: int, adapters: dict[str, Path]) -> LoRARequest:
    return LoRARequest(name, lora_id, str(adapters[name]))


def test_greedy_with_adapter_matches_hf_on_peft_merged_model(
        tiny_model_dir: Path, adapters: dict[str, Path], lora_engine: LLMEngine) -> None:
    got = generate(lora_engine, {"all": lora("all", 1, adapters), "qv": lora("qv", 2, adapters),
                                 "base": None})
    for name in ("all", "qv"):
        assert got[name] == hf_merged_greedy(tiny_model_dir, adapters[name], PROMPT, 10), name
    assert got["base"] == hf_merged_greedy(tiny_model_dir, None, PROMPT, 10)
    # The adapters really change the output (else the comparison above proves nothing).
    assert got["all"] != got["base"] and got["qv"] != got["base"]


def test_mixed_batch_equals_each_request_alone(adapters: dict[str, Path],
                                               lora_engine: LLMEngine) -> None:
    a1, a2 = lora("all", 1, adapters), lora("qv", 2, adapters)
    alone = {}
    for name, req in (("a1", a1), ("a2", a2), ("base", None)):
        lora_engine.reset_prefix_cache()
        alone[name] = generate(lora_engine, {name: req})[name]
    lora_engine.reset_prefix_cache()
    mixed = generate(lora_engine, {"a1": a1, "base": None, "a2": a2, "a1-again": a1})
    assert mixed == {**alone, "a1-again": alone["a1"]}


def test_request_output_names_its_adapter(adapters: dict[str, Path],
                                         lora_engine: LLMEngine) -> None:
    a = lora("all", 1, adapters)
    for request_id, req in (("with", a), ("without", None)):
        lora_engine.add_request(request_id, {"prompt_token_ids": PROMPT}, GREEDY,
                                lora_request=req)
    done = run_to_completion(lora_engine)
    assert done["with"].lora_request == a and done["without"].lora_request is None


def test_batch_holds_at_most_max_loras_adapters(tiny_model_dir: Path,
                                                adapters: dict[str, Path]) -> None:
    engine = make_lora_engine(tiny_model_dir, max_loras=1, max_cpu_loras=2)
    jobs = {"a1": lora("all", 1, adapters), "a2": lora("qv", 2, adapters), "base": None}
    for request_id, req in jobs.items():
        engine.add_request(request_id, {"prompt_token_ids": PROMPT}, GREEDY, lora_request=req)
    engine.step()
    running = {r.request_id for r in engine.engine_core.scheduler.running}
    assert running == {"a1", "base"}  # a2 waits for a1's adapter to leave the batch
    done = run_to_completion(engine)
    assert set(done) == {"a1", "a2", "base"}


def test_prefix_cache_is_never_shared_across_adapters(adapters: dict[str, Path],
                                                      lora_engine: LLMEngine) -> None:
    lora_engine.reset_prefix_cache()

    def cached(request_id: str, req: LoRARequest | None) -> int:
        lora_engine.add_request(request_id, {"prompt_token_ids": PROMPT}, GREEDY,
                                lora_request=req)
        return run_to_completion(lora_engine)[request_id].num_cached_tokens

    assert cached("p1", lora("all", 1, adapters)) == 0
    assert cached("p2", lora("qv", 2, adapters)) == 0  # same prompt, other adapter
    assert cached("p3", None) == 0  # the base model shares nothing with either
    assert cached("p4", lora("all", 1, adapters)) == 16  # same adapter: 4 full blocks of 4


def test_add_list_pin_remove_follow_vllm(adapters: dict[str, Path],
                                         lora_engine: LLMEngine) -> None:
    for lora_id in list(lora_engine.list_loras()):
        lora_engine.remove_lora(lora_id)
    assert lora_engine.add_lora(lora("all", 11, adapters)) is True
    assert lora_engine.add_lora(lora("qv", 12, adapters)) is True
    assert lora_engine.list_loras() == {11, 12}
    assert lora_engine.pin_lora(11) is True
    # max_cpu_loras=3: the fourth unloads the least recently used unpinned one (12).
    lora_engine.add_lora(lora("qv", 13, adapters))
    lora_engine.add_lora(lora("all", 14, adapters))
    assert lora_engine.list_loras() == {11, 13, 14}
    assert lora_engine.remove_lora(13) is True
    assert lora_engine.remove_lora(13) is False  # vLLM: False for one not loaded
    assert lora_engine.list_loras() == {11, 14}
    # A request whose adapter was removed reloads it from its directory.
    got = generate(lora_engine, {"again": lora("qv", 13, adapters)})
    assert 13 in lora_engine.list_loras() and len(got["again"]) == 10


def test_pinned_adapters_never_starve_a_step_of_its_own(tiny_model_dir: Path,
                                                        adapters: dict[str, Path],
                                                        lora_engine: LLMEngine) -> None:
    """max_cpu_loras=2 with one pinned: adding b unloads a, which the step then reloads past
    the bound rather than unloading b, already in its slot (its tokens would run bare)."""
    a, b = lora("all", 1, adapters), lora("qv", 2, adapters)
    lora_engine.reset_prefix_cache()
    alone = {"a": generate(lora_engine, {"a": a})["a"], "b": generate(lora_engine, {"b": b})["b"]}
    engine = make_lora_engine(tiny_model_dir, max_loras=2, max_cpu_loras=2)
    engine.add_lora(lora("all", 9, adapters))
    engine.pin_lora(9)
    assert generate(engine, {"a": a, "b": b}) == alone
    assert engine.list_loras() == {9, 1, 2}


def test_fused_decode_stands_aside_only_for_batches_with_an_adapter(
        adapters: dict[str, Path], lora_engine: LLMEngine,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU fused decode step reads base weights only: an adapter's batch must not take it,
    while base-model batches keep it with LoRA enabled."""
    from strand.kernels._cpu_build import KERNELS
    from tests.engine_core.model_executor.conftest import count_fused_calls

    if KERNELS.module() is None:
        pytest.skip("the CPU kernels are not built here: no fused decode step to check")
    calls: list[str] = []
    count_fused_calls(monkeypatch, calls)  # the stack's forward, or its logits
    lora_engine.reset_prefix_cache()
    generate(lora_engine, {"base": None})
    assert calls  # decode steps of the base model: fused
    calls.clear()
    generate(lora_engine, {"adapted": lora("all", 1, adapters)})
    assert not calls
