"""Drafts under tensor parallelism: rank 0 verifies, and the worker rank appends every token it
accepted (several a step) before the next step, so TP=2 gives TP=1's tokens without drafts."""

from __future__ import annotations

from pathlib import Path

from strand.engine_core import RequestOutput, SamplingParams
from tests.conftest import build_tiny_model
from tests.engine_core.distributed.conftest import tp_engine
from tests.engine_core.engine.conftest import run_to_completion
from tests.engine_core.spec_decode.conftest import NGRAM, repetitive_prompts


def test_tp2_with_drafts_gives_tp1_s_tokens(tmp_path: Path, tiny_model_dir: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "llama", with_tokenizer=False)
    prompts = repetitive_prompts(512)
    params = SamplingParams(temperature=0.0, max_tokens=24)
    results: dict[int, dict[str, RequestOutput]] = {}
    for tp, spec in ((1, None), (2, NGRAM)):
        with tp_engine(model_dir, tp, tokenizer=str(tiny_model_dir),
                       speculative_config=spec) as engine:
            for i, prompt in enumerate(prompts):
                engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
            results[tp] = run_to_completion(engine)
            if spec is not None:
                stats = engine.engine_core.scheduler.make_stats().spec_decoding
                assert stats is not None and stats.num_accepted_tokens > 0
    assert {k: v.outputs[0].token_ids for k, v in results[2].items()} == \
        {k: v.outputs[0].token_ids for k, v in results[1].items()}
