"""tests/v1/sample/logits_processors/test_custom_offline.py: custom logits processors named in
EngineArgs, applied per request from extra_args (vLLM v1's LogitsProcessor interface)."""

from __future__ import annotations

from pathlib import Path

import pytest

from strand.engine_core import EngineArgs, LLMEngine
from strand.engine_core.model_executor.sampling.logits_processor import resolve_logits_processor
from strand.engine_core.sampling_params import SamplingParams
from tests.engine_core.conformance.conftest import make_engine, run_to_completion
from tests.engine_core.conformance.dummy_logits_processor import DummyLogitsProcessor

QUALNAME = "tests.engine_core.conformance.dummy_logits_processor:DummyLogitsProcessor"
PROMPT = "kalo mi ne ru sa"


@pytest.fixture(scope="module")
def lp_engine(tiny_model_dir: Path) -> LLMEngine:
    return make_engine(tiny_model_dir, logits_processors=[QUALNAME])


def test_custom_logitsprocs(lp_engine: LLMEngine) -> None:
    """Requests with a target_token only ever sample it; the others are untouched."""
    plain = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    lp_engine.add_request("plain", PROMPT, plain)
    lp_engine.add_request("t7", PROMPT, plain.clone(extra_args={"target_token": 7}))
    lp_engine.add_request("t9", PROMPT, SamplingParams(temperature=0.8, max_tokens=5, seed=0,
                                                       extra_args={"target_token": 9}))
    done = run_to_completion(lp_engine)
    assert done["t7"].outputs[0].token_ids == [7] * 5
    assert done["t9"].outputs[0].token_ids == [9] * 5
    assert set(done["plain"].outputs[0].token_ids) != {7}
    # The same request alone (no processor effect) gives the same tokens as in the batch.
    lp_engine.add_request("plain2", PROMPT, plain)
    assert run_to_completion(lp_engine)["plain2"].outputs[0].token_ids == \
        done["plain"].outputs[0].token_ids


def test_custom_logitsprocs_validate_params(lp_engine: LLMEngine) -> None:
    with pytest.raises(ValueError, match="target_token"):
        lp_engine.add_request("bad", PROMPT, SamplingParams(extra_args={"target_token": -3}))
    assert not lp_engine.has_unfinished_requests()


def test_custom_logitsprocs_by_class(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, logits_processors=[DummyLogitsProcessor])
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=3,
                                                   extra_args={"target_token": 11}))
    assert run_to_completion(engine)["r"].outputs[0].token_ids == [11, 11, 11]


def test_rejects_custom_logitsprocs() -> None:
    for bad in ("no.such.module:Cls", "strand.engine_core.sampling_params:SamplingParams", ""):
        with pytest.raises(ValueError, match="logits_processors"):
            resolve_logits_processor(bad)


def test_logits_processors_cli_flag() -> None:
    import argparse

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--logits-processors", QUALNAME]))
    assert args.logits_processors == [QUALNAME]
