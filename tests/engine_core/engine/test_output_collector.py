"""RequestOutput.add and the output collector: a lagging consumer's outputs merge without loss."""

from __future__ import annotations

import asyncio

import pytest

from strand.engine_core.output_collector import RequestOutputCollector
from strand.engine_core.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from strand.engine_core.sampling_params import RequestOutputKind


def completion(index: int, text: str, token_ids: list[int], finish: str | None = None,
               logprob: float | None = None) -> CompletionOutput:
    logprobs = None if logprob is None else [{t: Logprob(logprob)} for t in token_ids]
    return CompletionOutput(index=index, text=text, token_ids=token_ids, logprobs=logprobs,
                            cumulative_logprob=logprob, finish_reason=finish,
                            stop_reason="." if finish == "stop" else None)


def output(*completions: CompletionOutput, finished: bool = False, **fields: object
           ) -> RequestOutput:
    return RequestOutput(request_id="r", prompt="p", prompt_token_ids=[1, 2],
                         outputs=list(completions), finished=finished, **fields)  # type: ignore[arg-type]


def test_delta_samples_of_n_append_each_to_its_own_index() -> None:
    merged = output(completion(0, "a", [10]), completion(1, "x", [20]))
    merged.add(output(completion(1, "y", [21])), aggregate=True)  # only sample 1 moved
    merged.add(output(completion(0, "b", [11], "stop", -0.5), completion(1, "z", [22])),
               aggregate=True)
    assert [(c.index, c.text, c.token_ids) for c in merged.outputs] == [
        (0, "ab", [10, 11]), (1, "xyz", [20, 21, 22])]
    assert merged.outputs[0].finish_reason == "stop" and merged.outputs[0].stop_reason == "."
    assert merged.outputs[0].cumulative_logprob == -0.5  # the later one's


def test_a_sample_first_seen_in_a_later_output_is_added() -> None:
    merged = output(completion(1, "x", [20]))
    merged.add(output(completion(0, "a", [10])), aggregate=True)
    assert sorted(c.index for c in merged.outputs) == [0, 1]


def test_cumulative_samples_are_replaced_by_their_later_selves() -> None:
    merged = output(completion(0, "a", [10]), completion(1, "x", [20]))
    merged.add(output(completion(0, "ab", [10, 11])), aggregate=False)
    assert [(c.text, c.token_ids) for c in merged.outputs] == [("ab", [10, 11]), ("x", [20])]


def test_logprobs_append_and_prompt_logprobs_extend_only_for_deltas() -> None:
    first_rows: list[dict[int, Logprob] | None] = [None, {2: Logprob(-1.0)}]
    later_rows: list[dict[int, Logprob] | None] = [{3: Logprob(-2.0)}]
    merged = output(completion(0, "a", [10], logprob=-1.0), prompt_logprobs=list(first_rows))
    merged.add(output(completion(0, "b", [11], logprob=-2.0), prompt_logprobs=later_rows),
               aggregate=True)
    assert merged.outputs[0].logprobs == [{10: Logprob(-1.0)}, {11: Logprob(-2.0)}]
    assert merged.prompt_logprobs == [*first_rows, *later_rows]
    merged.add(output(completion(0, "ab", [10, 11]), prompt_logprobs=later_rows),
               aggregate=False)
    assert merged.prompt_logprobs == later_rows


def test_the_later_finish_error_metrics_and_cache_count_win() -> None:
    merged = output(completion(0, "a", [10]), metrics=RequestMetrics(arrival_time=1.0))
    later_metrics = RequestMetrics(arrival_time=1.0, finished_time=3.0)
    merged.add(output(completion(0, "", [], "error"), finished=True, error="engine lost",
                      metrics=later_metrics, num_cached_tokens=16), aggregate=True)
    assert merged.finished and merged.error == "engine lost"
    assert merged.metrics is later_metrics and merged.num_cached_tokens == 16


def test_an_output_already_handed_out_is_not_changed_by_later_merges() -> None:
    async def run() -> tuple[RequestOutput, RequestOutput]:
        collector = RequestOutputCollector(RequestOutputKind.DELTA)
        collector.put(output(completion(0, "a", [10])))
        first = await collector.get()
        collector.put(output(completion(0, "b", [11])))
        collector.put(output(completion(0, "c", [12])))
        return first, await collector.get()

    first, second = asyncio.run(run())
    assert (first.outputs[0].text, first.outputs[0].token_ids) == ("a", [10])
    assert (second.outputs[0].text, second.outputs[0].token_ids) == ("bc", [11, 12])


def test_get_waits_for_the_producer() -> None:
    async def run() -> RequestOutput:
        collector = RequestOutputCollector(RequestOutputKind.CUMULATIVE)
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, collector.put, output(completion(0, "a", [10])))
        loop.call_later(0.01, collector.put, output(completion(0, "ab", [10, 11])))
        return await asyncio.wait_for(collector.get(), 5)

    got = asyncio.run(run())
    assert got.outputs[0].text == "ab"  # both arrived before the consumer ran: the later one


def test_an_error_put_is_raised_by_get_and_ends_the_stream() -> None:
    collector = RequestOutputCollector(RequestOutputKind.DELTA)
    collector.put(output(completion(0, "a", [10])))
    collector.put(ValueError("stage lost"))
    collector.put(output(completion(0, "b", [11])))  # after the error: nothing more counts
    with pytest.raises(ValueError, match="stage lost"):
        collector.get_nowait()
    assert collector.get_nowait() is None
