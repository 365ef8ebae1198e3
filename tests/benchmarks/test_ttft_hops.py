"""ttft_hops: span times are placed relative to each trace's Generate span."""

from __future__ import annotations

from benchmarks.ttft_hops import ROOT_SPAN, span_offsets


def test_offsets_are_per_trace_and_the_first_span_of_a_name_counts() -> None:
    ms = 1_000_000
    traces = {
        "a": [("gw", ROOT_SPAN, 100 * ms, 105 * ms), ("tok", "Process", 101 * ms, 104 * ms),
              ("tok", "Process", 110 * ms, 111 * ms)],
        "b": [("gw", ROOT_SPAN, 500 * ms, 507 * ms), ("tok", "Process", 503 * ms, 506 * ms)],
        "no-root": [("tok", "Process", 0, ms)],
    }
    offsets = span_offsets(traces)
    assert offsets[("gw", ROOT_SPAN)] == ([0.0, 0.0], [5.0, 7.0])
    assert offsets[("tok", "Process")] == ([1.0, 3.0], [4.0, 6.0])
