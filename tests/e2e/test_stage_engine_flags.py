"""Engine flags that the tokenizer and detokenizer stages act on (--max-logprobs,
--stream-interval) mean over gRPC what they mean in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strand.engine_core import SamplingParams
from strand.engine_core.sampling_params import RequestOutputKind
from strand.services.client import EngineClient
from strand.services.launch import Stack
from tests.e2e.conftest import start_stack


@pytest.fixture(scope="module")
def flagged_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Manually stepped: the client's generate runs each step and reads its outputs, so a
    # fast engine cannot run ahead of the client and have its DELTA outputs merged
    # (strand/services/gateway/stream_outputs.py), which in auto mode made the counts timing's.
    stack = start_stack(tiny_model_dir, tmp_path_factory.mktemp("flag-logs"),
                        engine_args=["--max-logprobs", "30", "--stream-interval", "3"])
    yield stack
    stack.stop()


def test_max_logprobs_is_the_engines_over_grpc_too(flagged_stack: Stack) -> None:
    with EngineClient(flagged_stack.gateway_address) as client:
        outs = list(client.generate("hello", SamplingParams(max_tokens=2, logprobs=25,
                                                             temperature=0.0)))
        logprobs = outs[-1].outputs[0].logprobs
        assert logprobs is not None and len(logprobs[0]) >= 25
        with pytest.raises(ValueError, match="31.*30|30.*31"):
            list(client.generate("hello", SamplingParams(max_tokens=2, logprobs=31)))


def test_stream_interval_streams_every_k_tokens_over_grpc(flagged_stack: Stack) -> None:
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    with EngineClient(flagged_stack.gateway_address) as client:
        counts = [len(o.outputs[0].token_ids) for o in client.generate("hello", params)]
    # The first token alone, then every 3, and the last whatever is left: 1 + 3 + 3 + 3.
    assert counts == [1, 3, 3, 3]
