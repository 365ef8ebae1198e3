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


def test_a_request_s_first_step_is_the_first_after_its_add_in_any_trace() -> None:
    # Auto-mode steps and the detokenizer's work on them are traces of their own: each request
    # is given the first of each that started after its engine add.
    from benchmarks.ttft_hops import AFTER_ADD, ENGINE_ADD

    ms = 1_000_000
    traces = {
        "a": [("gw", ROOT_SPAN, 100 * ms, 105 * ms), ("engine", ENGINE_ADD, 102 * ms, 103 * ms)],
        "b": [("gw", ROOT_SPAN, 200 * ms, 205 * ms), ("engine", ENGINE_ADD, 201 * ms, 202 * ms)],
        "step-1": [("engine", "engine_step", 101 * ms, 110 * ms)],  # before a's add: not a's
        "step-2": [("engine", "engine_step", 103 * ms, 115 * ms)],
        "step-3": [("engine", "engine_step", 202 * ms, 212 * ms)],
        "detok-2": [("detok", "strand.v1.Detokenizer/process_outputs", 116 * ms, 117 * ms)],
    }
    offsets = span_offsets(traces)
    assert offsets[("engine", "engine_step" + AFTER_ADD)] == ([3.0, 2.0], [15.0, 12.0])
    assert offsets[("detok", "strand.v1.Detokenizer/process_outputs" + AFTER_ADD)] == (
        [16.0], [17.0])
