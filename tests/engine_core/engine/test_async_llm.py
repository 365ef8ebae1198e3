"""AsyncLLM (vLLM's asyncio engine API) on the tiny model: its streams give what LLMEngine gives,
aborts and abandoned streams free the engine, a lagging consumer gets merged outputs, and a
failing step reaches every stream (vLLM's tests/v1/engine/test_async_llm.py, in spirit)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from strand.engine_core import EngineArgs, RequestOutput, RequestOutputKind, SamplingParams
from strand.engine_core.async_llm import AsyncLLM, EngineDeadError
from strand.engine_core.errors import DuplicateRequestError
from strand.engine_core.outputs import PoolingRequestOutput
from tests.engine_core.engine.conftest import assert_pool_whole, make_engine, run_to_completion

PROMPTS = [[1, 5, 9, 14], [1, 7], [1, 3, 3, 8, 21, 4, 6], [1, 30, 2, 11, 5]]
DELTA, FINAL_ONLY = RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY


def greedy(max_tokens: int, kind: RequestOutputKind = FINAL_ONLY) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          output_kind=kind)


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> Iterator[AsyncLLM]:
    engine = AsyncLLM.from_engine_args(EngineArgs(model=str(tiny_model_dir), dtype="float32",
                                                  device="cpu"))
    yield engine
    engine.shutdown()


async def collect(llm: AsyncLLM, request_id: str, prompt: list[int], params: SamplingParams
                  ) -> list[RequestOutput]:
    return [out async for out in llm.generate({"prompt_token_ids": prompt}, params, request_id)]


async def running(llm: AsyncLLM, request_id: str, prompt: list[int], params: SamplingParams
                  ) -> asyncio.Task[list[RequestOutput]]:
    """A stream collected by a task, returned once its first output is in (the request runs)."""
    first = asyncio.Event()

    async def consume() -> list[RequestOutput]:
        outputs = []
        async for out in llm.generate({"prompt_token_ids": prompt}, params, request_id):
            outputs.append(out)
            first.set()
        return outputs

    task = asyncio.create_task(consume())
    await asyncio.wait([asyncio.create_task(first.wait()), task],
                       return_when=asyncio.FIRST_COMPLETED)
    return task


def test_concurrent_streams_give_the_in_process_engines_tokens(
        llm: AsyncLLM, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    reference = make_engine(tiny_model_dir)
    for i, prompt in enumerate(PROMPTS):
        reference.add_request(str(i), {"prompt_token_ids": prompt}, greedy(6 + 3 * i))
    expected = {rid: out.outputs[0].token_ids for rid, out in run_to_completion(reference).items()}

    async def run() -> list[list[RequestOutput]]:
        return await asyncio.gather(*(collect(llm, str(i), p, greedy(6 + 3 * i))
                                      for i, p in enumerate(PROMPTS)))

    with caplog.at_level("WARNING", logger="strand.engine_core.core.engine"):
        streams = asyncio.run(run())
    # Loaded on the thread that steps it: its OpenMP threads are that thread's.
    assert not any("other than the one that loaded" in r.message for r in caplog.records)
    assert [len(s) for s in streams] == [1] * len(PROMPTS)  # FINAL_ONLY: one output each
    assert {s[0].request_id: s[0].outputs[0].token_ids for s in streams} == expected
    assert not llm.engine.has_unfinished_requests()
    assert_pool_whole(llm.engine)


def test_a_delta_stream_concatenates_and_only_its_last_output_is_finished(llm: AsyncLLM
                                                                           ) -> None:
    async def run() -> tuple[list[RequestOutput], list[RequestOutput]]:
        return (await collect(llm, "d", PROMPTS[0], greedy(8, DELTA)),
                await collect(llm, "f", PROMPTS[0], greedy(8)))

    deltas, final = asyncio.run(run())
    assert [o.finished for o in deltas] == [False] * (len(deltas) - 1) + [True]
    assert [t for o in deltas for t in o.outputs[0].token_ids] == final[0].outputs[0].token_ids
    assert "".join(o.outputs[0].text for o in deltas) == final[0].outputs[0].text
    assert deltas[-1].outputs[0].finish_reason == "length"


def test_abort_ends_its_stream_with_an_abort_output_and_the_others_run_on(llm: AsyncLLM) -> None:
    async def run() -> list[list[RequestOutput]]:
        tasks = [await running(llm, f"a{i}", p, greedy(400, DELTA))
                 for i, p in enumerate(PROMPTS)]
        await llm.abort(["a1", "a3", "not-live"])  # an id that is not live is ignored
        return list(await asyncio.gather(*tasks))

    streams = asyncio.run(run())
    for i, stream in enumerate(streams):
        tokens = sum(len(o.outputs[0].token_ids) for o in stream)
        reason = stream[-1].outputs[0].finish_reason
        assert stream[-1].finished
        if i in (1, 3):
            assert reason == "abort" and tokens < 400
        else:
            assert reason == "length" and tokens == 400
    assert not llm.engine.has_unfinished_requests()
    assert_pool_whole(llm.engine)


def test_leaving_a_stream_early_aborts_its_request(llm: AsyncLLM) -> None:
    async def run() -> int:
        async for _ in llm.generate({"prompt_token_ids": PROMPTS[0]}, greedy(200, DELTA), "l"):
            break  # the consumer leaves after its first output
        cancelled = await running(llm, "c", PROMPTS[1], greedy(1000, DELTA))
        cancelled.cancel()  # the consumer's task is cancelled mid-stream
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        for _ in range(200):
            if await llm.get_num_unfinished_requests() == 0:
                break
            await asyncio.sleep(0.01)
        return await llm.get_num_unfinished_requests()

    assert asyncio.run(run()) == 0
    assert_pool_whole(llm.engine)


def test_a_lagging_consumer_gets_the_outputs_merged(llm: AsyncLLM) -> None:
    async def run() -> tuple[list[RequestOutput], list[RequestOutput]]:
        outputs = []
        async for out in llm.generate({"prompt_token_ids": PROMPTS[2]}, greedy(30, DELTA),
                                      "slow"):
            outputs.append(out)
            await asyncio.sleep(0.05)  # several steps run meanwhile
        return outputs, await collect(llm, "ref", PROMPTS[2], greedy(30))

    outputs, final = asyncio.run(run())
    assert len(outputs) < 30  # fewer outputs than tokens: some carried several
    assert [t for o in outputs for t in o.outputs[0].token_ids] == final[0].outputs[0].token_ids


def test_bad_input_raises_before_any_output_and_changes_nothing(llm: AsyncLLM) -> None:
    async def run() -> None:
        with pytest.raises(ValueError, match="prompt_token_ids"):
            await collect(llm, "bad", [1, 10**9], greedy(4))
        live = await running(llm, "live", PROMPTS[0], greedy(400, DELTA))
        with pytest.raises(DuplicateRequestError):
            await collect(llm, "live", PROMPTS[1], greedy(4))
        with pytest.raises(ValueError, match="request_id must be a str, got list"):
            await collect(llm, ["x"], PROMPTS[1], greedy(4))  # type: ignore[arg-type]
        assert (await live)[-1].outputs[0].finish_reason == "length"

    asyncio.run(run())
    assert not llm.engine.has_unfinished_requests()


def test_a_failing_step_reaches_every_stream_and_later_calls(tiny_model_dir: Path) -> None:
    llm = AsyncLLM.from_engine_args(EngineArgs(model=str(tiny_model_dir), device="cpu"))

    def broken() -> list[RequestOutput | PoolingRequestOutput]:
        raise RuntimeError("kernel fault")

    async def run() -> None:
        llm.engine.step = broken  # type: ignore[method-assign]
        results = await asyncio.gather(*(collect(llm, str(i), p, greedy(4))
                                          for i, p in enumerate(PROMPTS[:2])),
                                       return_exceptions=True)
        assert all(isinstance(r, EngineDeadError) and "kernel fault" in str(r)
                   for r in results)
        with pytest.raises(EngineDeadError):
            await collect(llm, "later", PROMPTS[0], greedy(4))

    try:
        asyncio.run(run())
        assert llm.errored
    finally:
        llm.shutdown()
    assert not llm.is_running


def test_after_shutdown_generate_refuses(tiny_model_dir: Path) -> None:
    llm = AsyncLLM.from_engine_args(EngineArgs(model=str(tiny_model_dir), device="cpu"))
    llm.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(collect(llm, "x", PROMPTS[0], greedy(2)))


def test_shutdown_ends_the_streams_still_open(tiny_model_dir: Path) -> None:
    llm = AsyncLLM.from_engine_args(EngineArgs(model=str(tiny_model_dir), device="cpu"))

    async def run() -> list[RequestOutput]:
        stream = llm.generate({"prompt_token_ids": PROMPTS[0]}, greedy(1000, DELTA), "open")
        first = await anext(stream)
        llm.shutdown()  # from the loop's own thread, mid-stream
        return [first, *[out async for out in stream]]

    with pytest.raises(EngineDeadError, match="shut down before the request finished"):
        asyncio.run(run())


def test_a_model_that_cannot_load_raises_from_the_constructor(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        AsyncLLM.from_engine_args(EngineArgs(model=str(tmp_path / "missing"), device="cpu"))
