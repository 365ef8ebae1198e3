"""speculative_config: vLLM's keys and defaults, refused by name where wrong."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from strand.engine_core import EngineArgs
from strand.engine_core.sampling_params import SamplingParams
from strand.engine_core.spec_decode.config import drafts_allowed
from strand.engine_core.speculative_config import SpeculativeConfig
from strand.engine_core.structured_output.params import StructuredOutputsParams


def test_vllm_defaults_for_the_lookup_lengths() -> None:
    assert SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3}) == \
        SpeculativeConfig(3, 5, 5)
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 2, "prompt_lookup_max": 4}) \
        == SpeculativeConfig(2, 4, 4)
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 2, "prompt_lookup_min": 2}) \
        == SpeculativeConfig(2, 2, 2)
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 2, "prompt_lookup_min": 1,
                                        "prompt_lookup_max": 3}) == SpeculativeConfig(2, 1, 3)
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 2, "disable_by_batch_size": 8}
                                       ).disable_by_batch_size == 8


@pytest.mark.parametrize(("spec", "message"), [
    ({"method": "eagle", "num_speculative_tokens": 3}, "speculative_config.method must be one"),
    ({"method": "ngram"}, "num_speculative_tokens is required"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be in [1, 32], got 0"),
    ({"num_speculative_tokens": 33}, "num_speculative_tokens must be in [1, 32], got 33"),
    ({"num_speculative_tokens": "4"}, "num_speculative_tokens must be an integer"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens must be an integer"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 0}, "prompt_lookup_min must be >= 1"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
     "prompt_lookup_max must be >= prompt_lookup_min (3), got 2"),
    ({"num_speculative_tokens": 2, "model": "x"}, "speculative_config.model is not supported"),
    ({"num_speculative_tokens": 2, "disable_by_batch_size": 1},
     "disable_by_batch_size must be >= 2, got 1"),
    ([1], "speculative_config must be a JSON object"),
])
def test_bad_configs_are_refused_by_name(spec: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        EngineArgs(speculative_config=spec)


def test_not_with_custom_logits_processors() -> None:
    with pytest.raises(ValueError, match="speculative_config cannot be combined with "
                                         "logits_processors"):
        EngineArgs(speculative_config={"num_speculative_tokens": 2},
                   logits_processors=["pkg.mod:Cls"])


def test_the_flag_takes_json_and_reaches_the_scheduler() -> None:
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    args = EngineArgs.from_cli_args(parser.parse_args(["--speculative-config",
                                                       json.dumps(spec)]))
    assert args.speculative_config == spec
    assert args.scheduler_config(2048).speculative == SpeculativeConfig(4, 3, 3)
    assert EngineArgs().scheduler_config(2048).speculative is None


@pytest.mark.parametrize(("params", "allowed"), [
    (SamplingParams(temperature=0.0), True),
    (SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=3), True),
    (SamplingParams(temperature=0.0, logit_bias={3: 2.0}, allowed_token_ids=[3, 4]), True),
    (SamplingParams(temperature=0.0, min_tokens=4, stop_token_ids=[9]), True),
    (SamplingParams(temperature=0.0, logprobs=2, prompt_logprobs=1), True),
    (SamplingParams(temperature=0.0, presence_penalty=0.5), True),
    (SamplingParams(temperature=0.0, frequency_penalty=0.5), True),
    (SamplingParams(temperature=0.0, repetition_penalty=1.2), True),
    (SamplingParams(temperature=0.0, bad_words_token_ids=[[5]]), True),
    (SamplingParams(temperature=0.0, structured_outputs=StructuredOutputsParams(regex="a+")), False),
])
def test_which_requests_may_be_drafted(params: SamplingParams, allowed: bool) -> None:
    assert drafts_allowed(params) is allowed
