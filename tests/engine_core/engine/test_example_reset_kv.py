"""examples/llm_engine_reset_kv.py: the step loop with a reset at step 10 runs to completion."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.engine_core.engine.conftest import assert_pool_whole, make_engine

EXAMPLE = Path(__file__).parents[3] / "examples" / "llm_engine_reset_kv.py"


def test_example_finishes_every_request_and_resets_while_running(
        tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("llm_engine_reset_kv", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    engine = make_engine(tiny_model_dir)
    finished = example.run(engine, example.test_prompts())
    assert sorted(o.request_id for o in finished) == ["0", "1"]
    by_id = {o.request_id: o for o in finished}
    assert len(by_id["1"].outputs) == 2  # n=2
    assert by_id["0"].prompt_logprobs is not None and by_id["0"].outputs[0].logprobs
    assert "reset_prefix_cache(reset_running_requests=True) -> True" in capsys.readouterr().out
    assert_pool_whole(engine)
