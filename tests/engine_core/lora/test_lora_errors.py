"""Bad adapters and bad calls: ValueError naming the field and the bound, engine unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from strand.engine_core import LLMEngine, LoRARequest
from tests.engine_core.engine.conftest import make_engine
from tests.engine_core.lora.conftest import GREEDY, PROMPT, make_lora_engine, write_config


def add(engine: LLMEngine, req: LoRARequest) -> None:
    engine.add_request("r", {"prompt_token_ids": PROMPT}, GREEDY, lora_request=req)


def assert_unchanged(engine: LLMEngine, loaded: set[int]) -> None:
    assert not engine.has_unfinished_requests()
    assert engine.list_loras() == loaded


def test_lora_request_without_enable_lora_is_refused(tiny_model_dir: Path,
                                                      adapters: dict[str, Path]) -> None:
    engine = make_engine(tiny_model_dir)
    with pytest.raises(ValueError, match="enable_lora"):
        add(engine, LoRARequest("all", 1, str(adapters["all"])))
    assert not engine.has_unfinished_requests()
    for call, arg in ((engine.add_lora, LoRARequest("all", 1, str(adapters["all"]))),
                      (engine.remove_lora, 1), (engine.pin_lora, 1)):
        with pytest.raises(ValueError, match="enable_lora"):
            call(arg)  # type: ignore[operator,arg-type]


def test_rank_above_max_lora_rank_is_refused(tiny_model_dir: Path,
                                             adapters: dict[str, Path]) -> None:
    engine = make_lora_engine(tiny_model_dir, max_lora_rank=4)
    with pytest.raises(ValueError, match=r"r \(8\) must be <= max_lora_rank \(4\)"):
        add(engine, LoRARequest("all", 1, str(adapters["all"])))
    assert_unchanged(engine, set())
    engine.add_lora(LoRARequest("qv", 2, str(adapters["qv"])))  # rank 4: at the bound
    assert engine.list_loras() == {2}


@pytest.mark.parametrize(("change", "match"), [
    ({"r": 16}, r"r \(16\) must be <= max_lora_rank \(8\)"),
    ({"use_dora": True}, "use_dora"),
    ({"bias": "all"}, "bias"),
    ({"peft_type": "IA3"}, "peft_type"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
])
def test_unsupported_adapter_configs_are_refused(adapters: dict[str, Path], tmp_path: Path,
                                                 lora_engine: LLMEngine,
                                                 change: dict[str, object], match: str) -> None:
    adapter = Path(shutil.copytree(adapters["qv"], tmp_path / "bad"))
    write_config(adapter, **change)
    before = lora_engine.list_loras()
    with pytest.raises(ValueError, match=match):
        lora_engine.add_lora(LoRARequest("bad", 31, str(adapter)))
    assert_unchanged(lora_engine, before)


def test_missing_directory_and_unknown_ids(tmp_path: Path, lora_engine: LLMEngine) -> None:
    engine = lora_engine
    for lora_id in list(engine.list_loras()):
        engine.remove_lora(lora_id)
    with pytest.raises(ValueError, match="adapter_config.json"):
        add(engine, LoRARequest("none", 1, str(tmp_path / "missing")))
    assert_unchanged(engine, set())
    with pytest.raises(ValueError, match="lora_id 7 is not loaded"):
        engine.pin_lora(7)
    assert engine.remove_lora(7) is False


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"lora_name": "", "lora_int_id": 1, "lora_path": "/x"}, "lora_name"),
    ({"lora_name": "a", "lora_int_id": 0, "lora_path": "/x"}, "lora_int_id must be an int >= 1"),
    ({"lora_name": "a", "lora_int_id": 1, "lora_path": ""}, "lora_path"),
])
def test_lora_request_fields_are_checked(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LoRARequest(**kwargs)  # type: ignore[arg-type]


def test_all_pinned_and_full_refuses_another(tiny_model_dir: Path,
                                             adapters: dict[str, Path]) -> None:
    engine = make_lora_engine(tiny_model_dir, max_loras=1, max_cpu_loras=1)
    engine.add_lora(LoRARequest("all", 1, str(adapters["all"])))
    engine.pin_lora(1)
    with pytest.raises(ValueError, match=r"max_cpu_loras \(1\)"):
        engine.add_lora(LoRARequest("qv", 2, str(adapters["qv"])))
    assert engine.list_loras() == {1}


def test_engine_args_bounds() -> None:
    from strand.engine_core import EngineArgs

    with pytest.raises(ValueError, match="max_loras must be >= 1"):
        EngineArgs(max_loras=0)
    with pytest.raises(ValueError, match="max_cpu_loras must be >= max_loras"):
        EngineArgs(max_loras=2, max_cpu_loras=1)
    with pytest.raises(ValueError, match="max_concurrent_batches must be 1 with enable_lora"):
        EngineArgs(enable_lora=True, max_concurrent_batches=2)


def test_request_the_scheduler_refuses_leaves_no_adapter_loaded(
        tiny_model_dir: Path, adapters: dict[str, Path]) -> None:
    engine = make_lora_engine(tiny_model_dir, num_gpu_blocks_override=4)  # 3 blocks of 4 tokens
    with pytest.raises(ValueError, match="KV cache blocks"):
        add(engine, LoRARequest("all", 1, str(adapters["all"])))
    assert_unchanged(engine, set())
