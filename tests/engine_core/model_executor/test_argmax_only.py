"""Requests whose token is the bare argmax skip the sampling metadata and the sampler
(sampling_metadata.argmax_only; model_runner._sample): the same tokens, ties included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import EngineArgs, LLMEngine, SamplingParams
from strand.engine_core.model_executor import model_runner
from strand.engine_core.model_executor.sampler import argmax_tokens
from strand.engine_core.model_executor.sampling_metadata import argmax_only
from strand.engine_core.outputs import RequestOutput
from strand.engine_core.structured_output.params import StructuredOutputsParams
from tests.conftest import build_tiny_model
from tests.engine_core.model_executor.sampler_helpers import make_row, sample

VOCAB = 50


def test_a_plain_greedy_request_is_argmax_only() -> None:
    assert argmax_only(SamplingParams(temperature=0.0, stop_token_ids=[3], max_tokens=4,
                                      ignore_eos=True), 2, VOCAB)
    assert argmax_only(SamplingParams(temperature=0.0), None, VOCAB)


@pytest.mark.parametrize(("change", "eos"), [
    ({"temperature": 0.7}, 2),
    ({"logprobs": 1}, 2),
    ({"min_tokens": 2}, 2),
    ({"logit_bias": {3: 1.0}}, 2),
    ({"allowed_token_ids": [3, 4]}, 2),
    ({"bad_words_token_ids": [[5]]}, 2),
    ({"presence_penalty": 0.5}, 2),
    ({"frequency_penalty": 0.5}, 2),
    ({"repetition_penalty": 1.2}, 2),
    ({"stop_token_ids": [VOCAB]}, 2),  # the metadata's vocabulary check must still refuse it
    ({"structured_outputs": StructuredOutputsParams(regex="a+")}, 2),
    ({}, VOCAB),  # an eos past the vocabulary, likewise
])
def test_anything_the_sampler_does_beyond_the_argmax_is_not(change: dict[str, Any],
                                                            eos: int) -> None:
    assert not argmax_only(SamplingParams(**({"temperature": 0.0} | change)), eos, VOCAB)


def test_argmax_tokens_is_the_samplers_greedy_choice_with_ties_to_the_first() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (3, VOCAB), generator=g).float()  # many ties
    logits[1, 7] = float("nan")  # NaN counts as the maximum, as in torch.argmax
    want = sample(logits, [make_row(temperature=0.0) for _ in range(3)]).sampled_token_ids
    assert torch.equal(argmax_tokens(logits), want)
    assert torch.equal(want, logits.argmax(dim=-1))
    assert torch.equal(argmax_tokens(logits.to(torch.bfloat16)),
                       logits.to(torch.bfloat16).float().argmax(dim=-1))


def _generate(model_dir: Path, params: SamplingParams) -> list[list[int]]:
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(model_dir), block_size=4,
                                                   num_gpu_blocks_override=64))
    for i, prompt in enumerate([[5, 9, 13], [3, 3, 3, 3], [42]]):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    return [done[k] for k in sorted(done)]


def test_greedy_requests_skip_the_sampler_and_get_its_tokens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = build_tiny_model(tmp_path / "tiny")
    builds: list[int] = []
    real_build = model_runner.build_sampling_metadata

    def counting_build(*args: Any) -> Any:
        builds.append(1)
        return real_build(*args)

    monkeypatch.setattr(model_runner, "build_sampling_metadata", counting_build)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    fast = _generate(model_dir, params)
    assert not builds  # every step's tokens came from argmax_tokens alone
    monkeypatch.setattr(model_runner, "argmax_only", lambda *a: False)
    through_sampler = _generate(model_dir, params)
    assert builds and fast == through_sampler
