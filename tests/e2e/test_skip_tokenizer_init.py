"""--skip-tokenizer-init on the stack: no stage loads a tokenizer (the model's directory has
none), token-id prompts are served with token ids and text "", as the in-process engine gives
them, and a text prompt is INVALID_ARGUMENT in vLLM's words."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.services.client import EngineClient, RequestError
from tests.conftest import copy_without_tokenizer
from tests.e2e.conftest import start_stack
from tests.engine_core.conformance.conftest import make_engine, run_to_completion

PROMPT = {"prompt_token_ids": [1, 2, 3, 4]}


def test_a_stack_without_a_tokenizer_serves_token_ids(tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    model = copy_without_tokenizer(tiny_model_dir, tmp_path / "no-tokenizer")
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=1,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    engine = make_engine(model, skip_tokenizer_init=True)
    engine.add_request("ids", PROMPT, params)
    expected = run_to_completion(engine)["ids"].outputs[0].token_ids
    with start_stack(model, tmp_path / "logs", ["--auto-step"],
                     engine_args=["--skip-tokenizer-init"]) as stack:
        with EngineClient(stack.gateway_address, timeout=60) as client:
            final = list(client.generate(PROMPT, params, request_id="ids"))[-1]
            completion = final.outputs[0]
            assert final.finished and completion.text == ""
            assert completion.token_ids == expected
            assert completion.logprobs is not None
            assert all(lp.decoded_token is None for position in completion.logprobs
                       for lp in position.values())
            with pytest.raises(RequestError) as err:
                list(client.generate("abc", params))
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "cannot pass text prompts when skip_tokenizer_init is True" in str(err.value)
            with pytest.raises(RequestError, match="stop strings need a tokenizer"):
                list(client.generate(PROMPT, SamplingParams(stop=["x"])))
            assert not client.has_unfinished_requests()
