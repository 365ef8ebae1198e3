"""The OpenAI front's engine requests: what each HTTP request's jobs carry to the gateway."""

from __future__ import annotations

from typing import Any


def test_a_requests_priority_goes_with_each_of_its_engine_requests() -> None:
    import asyncio

    from engine_core.sampling_params import SamplingParams
    from services.openai.streams import Job, OutputStream, final_outputs

    asked: list[int] = []

    class Client:
        async def generate(self, prompt: Any, params: Any, request_id: str,
                           lora_request: Any = None, priority: int = 0) -> Any:
            asked.append(priority)
            from engine_core.outputs import CompletionOutput, RequestOutput

            yield RequestOutput(request_id, "p", [1], [CompletionOutput(
                0, "x", [2], finish_reason="stop")], True)

    async def run() -> None:
        jobs = [Job(f"r{i}", "p", SamplingParams(), None, priority=-3) for i in range(2)]
        await final_outputs(OutputStream(Client(), jobs), 2)  # type: ignore[arg-type]

    asyncio.run(run())
    assert asked == [-3, -3]
