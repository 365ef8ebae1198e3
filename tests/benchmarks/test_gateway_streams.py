"""The benchmarks' concurrent Generate streams add up what each request received."""

from __future__ import annotations

import pytest

from benchmarks.gateway_streams import generate_all
from engine_core.sampling_params import RequestOutputKind


def test_cumulative_outputs_are_refused_by_name_before_any_call() -> None:
    # Added up, CUMULATIVE outputs would count each token once per step after it.
    with pytest.raises(ValueError, match="output_kind must be FINAL_ONLY or DELTA"):
        generate_all("127.0.0.1:1", [], RequestOutputKind.CUMULATIVE)
