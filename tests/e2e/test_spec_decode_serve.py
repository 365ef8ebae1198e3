"""`strand serve --speculative-config` on a real stack: the engine stage drafts and verifies,
the text (whole and streamed, a step's accepted tokens in one delta) is what the same model
gives in process without drafts, and the engine's /metrics counts the drafts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from strand.engine_core import SamplingParams
from strand.services.launch import Stack, StackConfig, launch_stack
from tests.e2e.conftest import ENGINE_FLAGS
from tests.e2e.metrics_scrape import scrape, value
from tests.engine_core.spec_decode.conftest import NGRAM, repetitive_prompts, run

MAX_TOKENS = 40


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = StackConfig(model=str(tiny_model_dir),
                         engine_args=[*ENGINE_FLAGS, "--speculative-config", json.dumps(NGRAM)],
                         gateway_args=["--auto-step"], openai_port=0, metrics_port=0,
                         log_dir=tmp_path_factory.mktemp("spec-stack-logs"))
    with launch_stack(config, timeout=120) as running:
        yield running


def test_served_drafts_give_the_in_process_text_whole_and_streamed(
        stack: Stack, tiny_model_dir: Path) -> None:
    prompts = repetitive_prompts(512)
    want, _ = run(tiny_model_dir, prompts,
                  [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)] * len(prompts), False)
    with openai.OpenAI(base_url=f"http://{stack.address('openai')}/v1", api_key="unused",
                       max_retries=0, timeout=60) as client:
        for i, prompt in enumerate(prompts):
            whole = client.completions.create(model=stack.config.model, prompt=prompt,
                                              max_tokens=MAX_TOKENS, temperature=0)
            assert whole.choices[0].text == want[str(i)].outputs[0].text, i
            chunks = list(client.completions.create(
                model=stack.config.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                stream=True, stream_options={"include_usage": True}))
            texts = [c.choices[0].text for c in chunks if c.choices]
            assert "".join(texts) == whole.choices[0].text, i
            usage = chunks[-1].usage
            assert usage is not None and usage.completion_tokens == \
                len(want[str(i)].outputs[0].token_ids)
    _, samples = scrape(stack, "engine")
    accepted = value(samples, "strand:spec_decode_num_accepted_tokens_total")
    drafted = value(samples, "strand:spec_decode_num_draft_tokens_total")
    assert 0 < accepted < drafted
