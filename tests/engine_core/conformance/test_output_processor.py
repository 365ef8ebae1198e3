"""tests/v1/engine/test_output_processor.py (and vllm/v1/engine/parallel_sampling.py): engine
core outputs -> RequestOutputs: detokenization, stop strings, n > 1 aggregation,
stream_interval."""

from __future__ import annotations

import asyncio

import pytest

from strand.engine_core.output_collector import RequestOutputCollector
from strand.engine_core.outputs import CompletionOutput, Logprob, RequestOutput
from strand.engine_core.processing.output_processor import OutputProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import RequestOutputKind
from tests.engine_core.processing.conftest import logprob_rows, make_processed, step

DELTA, CUMULATIVE, FINAL_ONLY = (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE,
                                 RequestOutputKind.FINAL_ONLY)
TEXT = "kalo mi ne ru sa to"


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _feed(processor: OutputProcessor, request_id: str, ids: list[int],
          finish: str = "length") -> list[list[RequestOutput]]:
    """One token per step, the last finishing: each step's RequestOutputs."""
    steps = []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        result = processor.process_outputs([step(request_id, token,
                                                 finish_reason=finish if last else None)])
        steps.append(result.request_outputs)
    return steps


@pytest.mark.parametrize("kind", [DELTA, CUMULATIVE, FINAL_ONLY])
def test_incremental_detokenization(tokenizer: Tokenizer, kind: RequestOutputKind) -> None:
    processor = OutputProcessor(tokenizer)
    processor.add_request(make_processed(tokenizer, "r", output_kind=kind))
    ids = _ids(tokenizer, TEXT)
    steps = _feed(processor, "r", ids)
    if kind == FINAL_ONLY:
        assert [len(s) for s in steps] == [0] * (len(ids) - 1) + [1]
        assert steps[-1][0].outputs[0].text == TEXT
        return
    outputs = [s[0].outputs[0] for s in steps]
    if kind == DELTA:
        assert "".join(o.text for o in outputs) == TEXT
        assert [t for o in outputs for t in o.token_ids] == ids
    else:
        assert outputs[-1].text == TEXT and outputs[-1].token_ids == ids
    assert steps[-1][0].finished and not processor.has_unfinished_requests()


def test_logprobs_processor(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    processor.add_request(make_processed(tokenizer, "r", logprobs=1, prompt_logprobs=1))
    ka = _ids(tokenizer, "ka")[0]
    lo = _ids(tokenizer, "lo")[0]
    result = processor.process_outputs([step(
        "r", ka, new_logprobs=logprob_rows(([ka, lo], [-0.5, -0.1], 2)),
        new_prompt_logprobs=logprob_rows(([lo, ka], [-1.0, -0.2], 3)))])
    out = result.request_outputs[0]
    assert out.outputs[0].logprobs is not None and out.prompt_logprobs is not None
    position = out.outputs[0].logprobs[0]
    assert (position[ka].rank, position[ka].decoded_token) == (2, "ka")
    assert (position[lo].rank, position[lo].decoded_token) == (1, "lo")
    assert out.outputs[0].cumulative_logprob == pytest.approx(-0.5)
    second = out.prompt_logprobs[1]
    assert out.prompt_logprobs[0] is None and second is not None and second[lo].rank == 3


def test_stop_token(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    processor.add_request(make_processed(tokenizer, "r", stop_token_ids=[7]))
    ids = _ids(tokenizer, "kalo")
    processor.process_outputs([step("r", *ids)])
    result = processor.process_outputs([step("r", 7, finish_reason="stop", stop_reason=7)])
    completion = result.request_outputs[0].outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", 7)
    assert completion.token_ids == [*ids, 7]
    assert result.reqs_to_abort == []  # the core ended it itself


@pytest.mark.parametrize("include", [False, True])
def test_stop_string(tokenizer: Tokenizer, include: bool) -> None:
    processor = OutputProcessor(tokenizer)
    processor.add_request(make_processed(tokenizer, "r", stop=["ne"],
                                         include_stop_str_in_output=include))
    steps = _feed(processor, "r", _ids(tokenizer, TEXT))
    final = [o for s in steps for o in s][-1]
    completion = final.outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", "ne")
    assert completion.text == ("kalo mi ne" if include else "kalo mi ")
    assert not processor.has_unfinished_requests()


def test_abort_requests(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    processor.add_request(make_processed(tokenizer, "r", n=2, seed=1))
    assert processor.abort_requests(["r"]) == ["0_r", "1_r"]
    assert not processor.has_unfinished_requests()
    assert processor.process_outputs([step("0_r", 5)]).request_outputs == []


def test_iteration_stats(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    processor.add_request(make_processed(tokenizer, "r", arrival_time=100.0))
    ids = _ids(tokenizer, "kalo mi")
    processor.process_outputs([step("r", ids[0], first_scheduled_time=101.0)], 102.0)
    result = processor.process_outputs([step("r", ids[1], finish_reason="length")], 103.0)
    metrics = result.request_outputs[0].metrics
    assert metrics is not None
    assert (metrics.arrival_time, metrics.first_scheduled_time, metrics.first_token_time,
            metrics.last_token_time, metrics.finished_time) == (100.0, 101.0, 102.0, 103.0,
                                                                 103.0)
    assert metrics.time_in_queue == 1.0


# ---- n > 1 (vLLM's ParentRequest) -------------------------------------------------------

@pytest.mark.parametrize("kind", [DELTA, CUMULATIVE])
def test_parallel_sampling_streams_one_output_per_parent_per_step(
        tokenizer: Tokenizer, kind: RequestOutputKind) -> None:
    processor = OutputProcessor(tokenizer)
    processor.add_request(make_processed(tokenizer, "r", n=3, seed=0, output_kind=kind))
    ka, lo, mi = (_ids(tokenizer, w)[0] for w in ("ka", "lo", "mi"))
    # Step 1: children 0 and 2 produce a token; child 1 does not (e.g. still prefilling).
    result = processor.process_outputs([step("0_r", ka), step("2_r", mi)])
    (out,) = result.request_outputs
    assert out.request_id == "r" and not out.finished
    assert [(c.index, c.text) for c in out.outputs] == [(0, "ka"), (2, "mi")]
    # Step 2: child 1 only, finishing.
    result = processor.process_outputs([step("1_r", lo, finish_reason="length")])
    (out,) = result.request_outputs
    assert [(c.index, c.text, c.finish_reason) for c in out.outputs] == [(1, "lo", "length")]
    assert not out.finished  # the parent finishes with its last child
    # Step 3: both remaining children finish together.
    result = processor.process_outputs([step("0_r", lo, finish_reason="length"),
                                        step("2_r", ka, finish_reason="length")])
    (out,) = result.request_outputs
    expected = ["lo", "ka"] if kind == DELTA else ["kalo", "mika"]
    assert [c.index for c in out.outputs] == [0, 2]
    assert [c.text for c in out.outputs] == expected
    assert out.finished and not processor.has_unfinished_requests()


def test_parallel_sampling_final_only_aggregates_n(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    processor.add_request(make_processed(tokenizer, "r", n=2, seed=0, output_kind=FINAL_ONLY))
    ka, lo = (_ids(tokenizer, w)[0] for w in ("ka", "lo"))
    assert processor.process_outputs([step("0_r", ka, finish_reason="length"),
                                      step("1_r", lo)]).request_outputs == []
    (out,) = processor.process_outputs([step("1_r", ka, finish_reason="length")]).request_outputs
    assert [(c.index, c.text) for c in out.outputs] == [(0, "ka"), (1, "loka")]
    assert out.finished


def test_parallel_sampling_children_seeded_apart(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    children = processor.add_request(make_processed(tokenizer, "r", n=3, seed=10))
    assert [c.request_id for c in children] == ["0_r", "1_r", "2_r"]
    assert [c.sampling_params.seed for c in children] == [10, 11, 12]
    assert all(c.sampling_params.n == 1 for c in children)


# ---- stream_interval ------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [DELTA, CUMULATIVE])
def test_stream_interval(tokenizer: Tokenizer, kind: RequestOutputKind) -> None:
    processor = OutputProcessor(tokenizer, stream_interval=3)
    processor.add_request(make_processed(tokenizer, "r", output_kind=kind))
    ids = _ids(tokenizer, TEXT)
    assert len(ids) >= 6
    steps = _feed(processor, "r", ids)
    sent_at = [i for i, s in enumerate(steps) if s]
    # The first token, then every third one, and always the last.
    expected = sorted({0, *range(3, len(ids), 3), len(ids) - 1})
    assert sent_at == expected
    outputs = [s[0].outputs[0] for s in steps if s]
    if kind == DELTA:
        assert "".join(o.text for o in outputs) == TEXT
        assert [t for o in outputs for t in o.token_ids] == ids
    else:
        assert outputs[-1].text == TEXT


def test_stream_interval_is_validated(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="stream_interval must be >= 1"):
        OutputProcessor(tokenizer, stream_interval=0)


def test_stream_interval_final_only_unchanged(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer, stream_interval=2)
    processor.add_request(make_processed(tokenizer, "r", output_kind=FINAL_ONLY))
    steps = _feed(processor, "r", _ids(tokenizer, TEXT))
    assert [len(s) for s in steps][-1] == 1 and sum(len(s) for s in steps) == 1


def _collector_outputs(count: int) -> list[RequestOutput]:
    """vLLM's case: one token a step, the cumulative logprob idx + 1, the last one finished."""
    return [RequestOutput(
        request_id="my-request-id", prompt=None, prompt_token_ids=[1, 2, 3],
        outputs=[CompletionOutput(index=0, text="a", token_ids=[idx],
                                  cumulative_logprob=idx + 1.0,
                                  logprobs=[{7: Logprob(float(-idx)), 8: Logprob(-1.0)}],
                                  finish_reason="length" if idx == count - 1 else None)],
        finished=idx == count - 1) for idx in range(count)]


@pytest.mark.parametrize("num_to_put", [1, 2, 3])
def test_request_output_collector(num_to_put: int) -> None:
    """vLLM's RequestOutputCollector: DELTA outputs put before a get merge into one."""
    async def run() -> RequestOutput:
        collector = RequestOutputCollector(DELTA, request_id="my-request-id-int")
        for output in _collector_outputs(3)[:num_to_put]:
            collector.put(output)
        got = await collector.get()
        assert not collector.ready.is_set()
        assert collector.output is None
        return got

    output = asyncio.run(run())
    completion = output.outputs[0]
    assert output.finished == (num_to_put == 3)
    assert completion.finish_reason == ("length" if num_to_put == 3 else None)
    assert completion.text == "a" * num_to_put
    assert completion.token_ids == list(range(num_to_put))
    assert completion.logprobs is not None and len(completion.logprobs) == num_to_put
    assert completion.cumulative_logprob == 1.0 * num_to_put  # the last one's


def test_request_output_collector_get_nowait() -> None:
    collector = RequestOutputCollector(DELTA)
    assert collector.get_nowait() is None
    for output in _collector_outputs(3):
        collector.put(output)
    merged = collector.get_nowait()
    assert merged is not None and merged.finished and merged.outputs[0].text == "aaa"
    assert collector.get_nowait() is None and not collector.ready.is_set()
