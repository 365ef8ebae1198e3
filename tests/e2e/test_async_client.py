"""AsyncEngineClient against real stacks: the same outputs as EngineClient in both modes, many
requests on its one channel at once, cancellation aborts, and EngineClient's errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.services.async_client import AsyncEngineClient
from strand.services.client import EngineClient, RequestError, ServerUnavailable
from strand.services.launch import Stack, free_port
from tests.e2e.conftest import engine_num_unfinished

T = TypeVar("T")
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


def _run(stack: Stack, body: Callable[[AsyncEngineClient], Awaitable[T]]) -> T:
    """body(client) on a fresh event loop, with a client made on that loop (with the stack's
    api key where its gateway has one)."""
    args = stack.config.gateway_args
    key = args[args.index("--api-key") + 1] if "--api-key" in args else None

    async def main() -> T:
        async with AsyncEngineClient(stack.gateway_address, api_key=key) as client:
            return await body(client)
    return asyncio.run(main())


async def _outputs(client: AsyncEngineClient, prompt: str, params: SamplingParams,
                   request_id: str | None = None) -> list[RequestOutput]:
    return [o async for o in client.generate(prompt, params, request_id=request_id)]


@pytest.mark.parametrize("mode", ["manual", "auto"])
def test_generate_gives_engine_clients_outputs(mode: str, stack: Stack, auto_stack: Stack,
                                               client: EngineClient,
                                               auto_client: EngineClient) -> None:
    target, sync = (stack, client) if mode == "manual" else (auto_stack, auto_client)
    expected = list(sync.generate("The quick brown fox", GREEDY))
    got = _run(target, lambda c: _outputs(c, "The quick brown fox", GREEDY, "async-1"))
    assert [o.finished for o in got][-1] and not any(o.finished for o in got[:-1])
    if mode == "manual":  # one output a Step; in auto mode a reader that lags gets them merged
        assert len(got) == len(expected)
    assert got[-1].request_id == "async-1"
    assert got[-1].outputs[0].token_ids == expected[-1].outputs[0].token_ids
    assert got[-1].outputs[0].text == expected[-1].outputs[0].text


@pytest.mark.parametrize("mode", ["manual", "auto"])
def test_many_requests_share_the_channel(mode: str, stack: Stack, auto_stack: Stack,
                                         client: EngineClient) -> None:
    target = stack if mode == "manual" else auto_stack
    prompts = [f"prompt number {i}" for i in range(8)]
    expected = [list(client.generate(p, GREEDY))[-1].outputs[0].token_ids for p in prompts]

    async def body(c: AsyncEngineClient) -> list[list[RequestOutput]]:
        return list(await asyncio.gather(*(_outputs(c, p, GREEDY) for p in prompts)))

    got = _run(target, body)
    assert [outs[-1].outputs[0].token_ids for outs in got] == expected
    assert all(outs[-1].finished for outs in got)


def test_leaving_a_stream_aborts_its_request(auto_stack: Stack) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True,
                          output_kind=RequestOutputKind.DELTA)

    async def body(c: AsyncEngineClient) -> int:
        stream = c.generate("keep going", long)
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                break
        await stream.aclose()
        # Gone from the engine while this client and its channel are still open.
        deadline = time.monotonic() + 10
        while engine_num_unfinished(auto_stack) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert engine_num_unfinished(auto_stack) == 0
        return seen

    assert _run(auto_stack, body) == 3


def test_abort_request_ends_a_running_request(auto_stack: Stack) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True,
                          output_kind=RequestOutputKind.DELTA)

    async def body(c: AsyncEngineClient) -> RequestOutput:
        stream = c.generate("stop me", long, request_id="to-abort")
        await stream.__anext__()
        await c.abort_request("to-abort")
        await c.abort_request(["never-added"])  # not running: ignored, as LLMEngine does
        last = [o async for o in stream][-1]
        return last

    last = _run(auto_stack, body)
    assert last.finished and last.outputs[0].finish_reason == "abort"


def test_bad_input_is_a_request_error_naming_the_field(auto_stack: Stack) -> None:
    with pytest.raises(RequestError, match="max_tokens"):
        _run(auto_stack, lambda c: _outputs(c, "x", SamplingParams(max_tokens=10**9)))


def test_add_request_and_step_as_engine_client(stack: Stack, client: EngineClient) -> None:
    expected = list(client.generate("add and step", GREEDY))[-1].outputs[0].token_ids

    async def body(c: AsyncEngineClient) -> list[int]:
        await c.add_request("as-1", "add and step", GREEDY)
        last = None
        while await c.has_unfinished_requests():
            for out in await c.step():
                assert isinstance(out, RequestOutput)  # a generating engine's
                last = out
        assert last is not None and last.finished
        return list(last.outputs[0].token_ids)

    assert _run(stack, body) == expected


def test_nothing_listening_is_server_unavailable() -> None:
    async def main() -> None:
        async with AsyncEngineClient(f"127.0.0.1:{free_port()}", timeout=5) as c:
            await c.get_server_info()

    with pytest.raises(ServerUnavailable, match="no strand gateway answering"):
        asyncio.run(main())
