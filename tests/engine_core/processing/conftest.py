"""Builders for the processing tests: a tiny trained tokenizer and hand-made core outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreRequest
from strand.engine_core.core.runner_output import LogprobsLists
from strand.engine_core.processing.input_processor import ProcessedPrompt
from strand.engine_core.processing.output_processor import OutputProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams
from strand.testing.tiny_tokenizer import write_tiny_tokenizer

TINY_VOCAB_SIZE = 400


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-tokenizer")
    write_tiny_tokenizer(path, TINY_VOCAB_SIZE, seed=0)
    return path


@pytest.fixture(scope="session")
def tokenizer(tiny_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(str(tiny_tokenizer_dir))


@pytest.fixture
def output_processor(tokenizer: Tokenizer) -> OutputProcessor:
    return OutputProcessor(tokenizer)


def make_processed(
    tokenizer: Tokenizer,
    request_id: str = "r",
    prompt: str = "kalo mi",
    arrival_time: float = 100.0,
    **params: Any,
) -> ProcessedPrompt:
    request = EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=tokenizer.encode(prompt),
        sampling_params=SamplingParams(**params),
        eos_token_id=tokenizer.eos_token_id,
        arrival_time=arrival_time,
    )
    return ProcessedPrompt(request=request, prompt=prompt)


def step(request_id: str, *token_ids: int, **fields: Any) -> EngineCoreOutput:
    return EngineCoreOutput(request_id=request_id, new_token_ids=list(token_ids), **fields)


def logprob_rows(*rows: tuple[list[int], list[float], int]) -> LogprobsLists:
    """Each row: (ids with the sampled/prompt token first, their logprobs, its rank)."""
    return LogprobsLists(
        logprob_token_ids=[r[0] for r in rows],
        logprobs=[r[1] for r in rows],
        sampled_token_ranks=[r[2] for r in rows],
    )


def stream_text(
    processor: OutputProcessor, request_id: str, token_ids: list[int], finish: str = "length"
) -> list[str]:
    """Feed one token per step, the last one finishing; return each step's first-output text."""
    texts: list[str] = []
    for i, token_id in enumerate(token_ids):
        last = i == len(token_ids) - 1
        result = processor.process_outputs(
            [step(request_id, token_id, finish_reason=finish if last else None)]
        )
        texts.extend(out.outputs[0].text for out in result.request_outputs)
    return texts
