"""The benchmarks' concurrent Generate streams add up what each request received, and count a
request that ended badly."""

from __future__ import annotations

import pytest

from benchmarks.common import ended_badly
from benchmarks.gateway_streams import generate_all
from strand.engine_core.outputs import CompletionOutput, RequestOutput
from strand.engine_core.sampling_params import RequestOutputKind


def test_cumulative_outputs_are_refused_by_name_before_any_call() -> None:
    # Added up, CUMULATIVE outputs would count each token once per step after it.
    with pytest.raises(ValueError, match="output_kind must be FINAL_ONLY or DELTA"):
        generate_all("127.0.0.1:1", [], RequestOutputKind.CUMULATIVE)


def _output(finished: bool, reason: str | None, error: str | None = None) -> RequestOutput:
    return RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1],
                         outputs=[CompletionOutput(index=0, text="", token_ids=[2],
                                                   finish_reason=reason)],
                         finished=finished, error=error)


@pytest.mark.parametrize(("finished", "reason", "error", "bad"), [
    (False, None, None, False),  # still running
    (True, "length", None, False),
    (True, "stop", None, False),
    (True, "abort", None, True),
    (True, "error", "engine stage is unavailable", True),
    (False, None, "engine stage is unavailable", True),
])
def test_a_stream_ends_badly_on_an_error_or_a_finish_other_than_length_or_stop(
        finished: bool, reason: str | None, error: str | None, bad: bool) -> None:
    assert ended_badly("streams", _output(finished, reason, error)) is bad
