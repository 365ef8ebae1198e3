"""OutputProcessor: stop strings, output kinds, abort and error endings, metrics."""

from __future__ import annotations

import pytest

from strand.engine_core.core.runner_output import LogprobsLists
from strand.engine_core.processing.output_processor import OutputProcessor
from strand.engine_core.processing.parallel_sampling import fan_out
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import RequestOutputKind

from .conftest import logprob_rows, make_processed, step, stream_text


def ids_of(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_single_request_streams_cumulative_text(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    children = output_processor.add_request(make_processed(tokenizer, "r"))
    assert [c.request_id for c in children] == ["r"]
    ids = ids_of(tokenizer, "kalo mi ne")
    texts = stream_text(output_processor, "r", ids)
    assert texts[-1] == "kalo mi ne"
    assert not output_processor.has_unfinished_requests()


def test_finished_output_carries_reason_tokens_and_prompt(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", prompt="kalo"))
    ids = ids_of(tokenizer, "mi")
    result = output_processor.process_outputs([step("r", *ids, 2, finish_reason="stop")])
    (out,) = result.request_outputs
    assert out.finished and out.prompt == "kalo"
    assert out.prompt_token_ids == tokenizer.encode("kalo")
    completion = out.outputs[0]
    assert (completion.text, completion.token_ids) == ("mi", [*ids, 2])
    assert (completion.finish_reason, completion.stop_reason) == ("stop", None)
    assert result.reqs_to_abort == []


def test_stop_string_spanning_tokens_cuts_text_and_asks_core_abort(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", stop=["o mi"], max_tokens=50))
    ids = ids_of(tokenizer, "kalo mi ne")
    results = [output_processor.process_outputs([step("r", t)]) for t in ids]
    stopping = next(i for i, r in enumerate(results) if r.reqs_to_abort)
    assert results[stopping].reqs_to_abort == ["r"]
    completion = results[stopping].request_outputs[0].outputs[0]
    assert (completion.text, completion.finish_reason) == ("kal", "stop")
    assert completion.stop_reason == "o mi"
    assert completion.token_ids == ids[: stopping + 1]
    # The core may still send a step for it before the abort lands: nothing more is reported.
    assert all(not r.request_outputs for r in results[stopping + 1 :])
    assert not output_processor.has_unfinished_requests()


def test_stop_string_kept_with_include_stop_str_in_output(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(
        make_processed(tokenizer, "r", stop=["o mi"], include_stop_str_in_output=True)
    )
    texts = stream_text(output_processor, "r", ids_of(tokenizer, "kalo mi ne"))
    assert texts[-1] == "kalo mi"


def test_streamed_text_never_shows_a_stop_string_prefix_it_later_cuts(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", stop=["mi ne"]))
    texts = stream_text(output_processor, "r", ids_of(tokenizer, "kalo mi ne ru"))
    assert texts[-1] == "kalo "
    assert all("kalo ".startswith(t) for t in texts)


def test_stop_string_in_the_final_step_needs_no_core_abort(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", stop=["mi"]))
    ids = ids_of(tokenizer, "kalo mi")
    result = output_processor.process_outputs([step("r", *ids, finish_reason="length")])
    assert result.reqs_to_abort == []
    completion = result.request_outputs[0].outputs[0]
    assert (completion.text, completion.finish_reason, completion.stop_reason) == (
        "kalo ", "stop", "mi")


def test_n2_children_are_seeded_apart_and_aggregated(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    children = output_processor.add_request(make_processed(
        tokenizer, "r", n=2, seed=7, output_kind=RequestOutputKind.FINAL_ONLY))
    assert [c.request_id for c in children] == ["0_r", "1_r"]
    assert [c.sampling_params.seed for c in children] == [7, 8]
    assert all(c.sampling_params.n == 1 for c in children)
    a, b = ids_of(tokenizer, "kalo"), ids_of(tokenizer, "mi")
    first = output_processor.process_outputs([step("0_r", *a, finish_reason="length")])
    assert first.request_outputs == []  # FINAL_ONLY: nothing until all n have finished
    last = output_processor.process_outputs([step("1_r", *b, finish_reason="length")])
    (out,) = last.request_outputs
    assert out.finished and out.request_id == "r"
    assert [(c.index, c.text) for c in out.outputs] == [(0, "kalo"), (1, "mi")]
    assert not output_processor.has_unfinished_requests()


def test_n2_without_seed_leaves_children_unseeded(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    children = output_processor.add_request(make_processed(tokenizer, "r", n=2))
    assert [c.sampling_params.seed for c in children] == [None, None]


@pytest.mark.parametrize("n", [1, 2])
def test_delta_chunks_concatenate_to_the_cumulative_result(
    tokenizer: Tokenizer, n: int
) -> None:
    texts = {}
    for kind in (RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA):
        processor = OutputProcessor(tokenizer)
        processor.add_request(
            make_processed(tokenizer, "r", n=n, stop=["ne r"], output_kind=kind, logprobs=1)
        )
        ids = ids_of(tokenizer, "kalo 中 龍 mi ne ru")
        got: dict[int, tuple[str, list[int], int]] = {i: ("", [], 0) for i in range(n)}
        for t in ids:
            outs = processor.process_outputs(
                [step(f"{i}_r" if n > 1 else "r", t, new_logprobs=_row(t)) for i in range(n)]
            ).request_outputs
            for out in outs:
                for c in out.outputs:
                    text, toks, num_lp = got[c.index]
                    assert c.logprobs is not None
                    if kind == RequestOutputKind.DELTA:
                        got[c.index] = (text + c.text, toks + c.token_ids, num_lp + len(c.logprobs))
                    else:
                        got[c.index] = (c.text, c.token_ids, len(c.logprobs))
        texts[kind] = got
    assert texts[RequestOutputKind.DELTA] == texts[RequestOutputKind.CUMULATIVE]
    assert texts[RequestOutputKind.DELTA][0][0] == "kalo 中 龍 mi "


def _row(token_id: int) -> LogprobsLists:
    return logprob_rows(([token_id], [-0.5], 1))


def test_final_only_reports_once_when_finished(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(
        make_processed(tokenizer, "r", output_kind=RequestOutputKind.FINAL_ONLY)
    )
    ids = ids_of(tokenizer, "kalo mi")
    reported = [
        output_processor.process_outputs(
            [step("r", t, finish_reason="length" if i == len(ids) - 1 else None)]
        ).request_outputs
        for i, t in enumerate(ids)
    ]
    assert [len(r) for r in reported] == [0] * (len(ids) - 1) + [1]
    assert reported[-1][0].outputs[0].text == "kalo mi"


def test_abort_drops_the_request_and_returns_child_ids(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", n=2))
    output_processor.process_outputs([step("0_r", 5, finish_reason="length")])
    assert output_processor.abort_requests(["r", "unknown"]) == ["1_r"]
    assert not output_processor.has_request("r")
    assert output_processor.process_outputs([step("1_r", 5)]).request_outputs == []


def test_abort_by_child_id_drops_the_whole_parent(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", n=2))
    assert output_processor.abort_requests(["1_r"]) == ["0_r", "1_r"]
    assert output_processor.get_num_unfinished_requests() == 0


def test_finish_with_error_ends_requests_with_the_reason(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", n=2))
    output_processor.process_outputs([step("0_r", *ids_of(tokenizer, "kalo"))])
    (out,) = output_processor.finish_with_error(["r"], "engine stage unavailable")
    assert out.finished and out.error == "engine stage unavailable"
    assert [c.finish_reason for c in out.outputs] == ["error", "error"]
    assert out.outputs[0].text == "kalo"
    assert not output_processor.has_unfinished_requests()
    assert output_processor.finish_with_error(["r"], "again") == []


def test_sample_logprobs_become_dicts_and_sum_into_cumulative(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", logprobs=2))
    a, b = ids_of(tokenizer, "kalo mi")[:2]
    rows = logprob_rows(([a, a, b], [-0.1, -0.1, -2.5], 1), ([b, a, b], [-2.0, -0.3, -2.0], 2))
    result = output_processor.process_outputs([step("r", a, b, new_logprobs=rows)])
    completion = result.request_outputs[0].outputs[0]
    assert completion.cumulative_logprob == pytest.approx(-2.1)
    assert completion.logprobs is not None
    first, second = completion.logprobs
    assert {t: (lp.logprob, lp.rank) for t, lp in first.items()} == {a: (-0.1, 1), b: (-2.5, 2)}
    assert {t: lp.rank for t, lp in second.items()} == {b: 2, a: 1}
    assert second[b].decoded_token == tokenizer.decode([b])


def test_rows_wider_than_the_request_asked_are_cut_to_its_k(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    # The sampler gathers the batch's largest k (here 3) for every row; a request that asked
    # for 1 gets its sampled token and its top 1, as vLLM's (the bug: all three came back).
    output_processor.add_request(make_processed(tokenizer, "r", logprobs=1))
    a, b, c = ids_of(tokenizer, "kalo mi pona")[:3]
    rows = logprob_rows(([b, a, b, c], [-1.2, -0.5, -1.2, -1.9], 2))
    completion = output_processor.process_outputs(
        [step("r", b, new_logprobs=rows)]).request_outputs[0].outputs[0]
    assert completion.logprobs is not None
    assert {t: lp.rank for t, lp in completion.logprobs[0].items()} == {b: 2, a: 1}


def test_without_logprobs_there_is_no_cumulative_logprob(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r"))
    completion = output_processor.process_outputs([step("r", 5)]).request_outputs[0].outputs[0]
    assert (completion.logprobs, completion.cumulative_logprob) == (None, None)


def test_prompt_logprobs_assemble_across_chunks_with_none_first(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", prompt_logprobs=0))
    chunk1 = logprob_rows(([10], [-1.0], 3))
    chunk2 = logprob_rows(([11], [-2.0], 4), ([12], [-3.0], 5))
    assert output_processor.process_outputs(
        [step("r", new_prompt_logprobs=chunk1)]).request_outputs == []
    result = output_processor.process_outputs([step("r", 7, new_prompt_logprobs=chunk2)])
    prompt_logprobs = result.request_outputs[0].prompt_logprobs
    assert prompt_logprobs is not None and prompt_logprobs[0] is None
    rows = [p for p in prompt_logprobs[1:] if p is not None]
    assert [next(iter(p.items()))[0] for p in rows] == [10, 11, 12]
    assert [p[t].rank for p, t in zip(rows, [10, 11, 12], strict=True)] == [3, 4, 5]


def test_metrics_follow_arrival_scheduling_tokens_and_finish(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", arrival_time=100.0))
    output_processor.process_outputs(
        [step("r", 5, first_scheduled_time=101.0, num_cached_tokens=16)], iteration_timestamp=102.0
    )
    result = output_processor.process_outputs(
        [step("r", 6, finish_reason="length")], iteration_timestamp=103.0
    )
    out = result.request_outputs[0]
    metrics = out.metrics
    assert metrics is not None
    assert (metrics.arrival_time, metrics.first_scheduled_time) == (100.0, 101.0)
    assert (metrics.first_token_time, metrics.last_token_time) == (102.0, 103.0)
    assert metrics.finished_time == 103.0
    assert metrics.time_in_queue == 1.0
    assert out.num_cached_tokens == 16


def test_returned_outputs_are_not_changed_by_later_steps(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r"))
    first = output_processor.process_outputs([step("r", 5)], 1.0).request_outputs[0]
    output_processor.process_outputs([step("r", 6)], 2.0)
    assert first.outputs[0].token_ids == [5]
    assert first.metrics is not None and first.metrics.last_token_time == 1.0


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY])
def test_several_steps_in_one_batch_read_as_those_steps_one_by_one(
    tokenizer: Tokenizer, kind: RequestOutputKind
) -> None:
    # An engine answering several steps at once lists each request's outputs in step order.
    ids = ids_of(tokenizer, "kalo 中 龍 mi ne ru")
    results = []
    for per_call in (1, 3):
        processor = OutputProcessor(tokenizer)
        processor.add_request(make_processed(tokenizer, "r", stop=["ne r"], output_kind=kind))
        text, tokens, finished = "", [], False
        for start in range(0, len(ids), per_call):
            outs = processor.process_outputs([step("r", t) for t in ids[start:start + per_call]])
            for out in outs.request_outputs:
                text += out.outputs[0].text
                tokens += out.outputs[0].token_ids
                finished = out.finished
        results.append((text, tokens, finished))
    assert results[0] == results[1]
    assert results[0][0] == "kalo 中 龍 mi " and results[0][2]


def test_children_are_fan_out_of_the_request(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    # The tokenizer sends fan_out's children to the engine without asking this processor.
    processed = make_processed(tokenizer, "r", n=3, seed=7)
    children = output_processor.add_request(processed)
    expected = fan_out(processed.request)
    assert [(c.request_id, c.sampling_params.seed) for c in children] == [
        (c.request_id, c.sampling_params.seed) for c in expected] == [
        ("0_r", 7), ("1_r", 8), ("2_r", 9)]
    assert fan_out(make_processed(tokenizer, "s").request)[0].request_id == "s"


def test_recently_ended_names_children_that_ended_until_added_again(
    tokenizer: Tokenizer, output_processor: OutputProcessor
) -> None:
    output_processor.add_request(make_processed(tokenizer, "r", n=2))
    assert not output_processor.recently_ended("0_r")
    output_processor.abort_requests(["r"])
    assert output_processor.recently_ended("0_r") and output_processor.recently_ended("1_r")
    assert not output_processor.recently_ended("r")  # a parent id is not a child here
    output_processor.add_request(make_processed(tokenizer, "r", n=2))
    assert not output_processor.recently_ended("0_r")


def test_a_metrics_snapshot_keeps_its_values_while_the_request_goes_on() -> None:
    from strand.engine_core.outputs import RequestMetrics

    live = RequestMetrics(arrival_time=1.0, first_scheduled_time=2.0, first_token_time=3.0,
                          last_token_time=4.0, finished_time=None, preemption_times=[2.5])
    kept = live.snapshot()
    assert kept == live and kept.preemption_times is not live.preemption_times
    live.preemption_times.append(3.5)
    live.last_token_time = 5.0
    assert kept.preemption_times == [2.5] and kept.last_token_time == 4.0
