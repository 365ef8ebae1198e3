"""The OpenAI front's engine requests: what each HTTP request's jobs carry to the gateway."""

from __future__ import annotations

from typing import Any

import pytest


def test_a_requests_priority_goes_with_each_of_its_engine_requests() -> None:
    import asyncio

    from strand.engine_core.sampling_params import SamplingParams
    from strand.services.openai.streams import Job, OutputStream, final_outputs

    asked: list[int] = []

    class Client:
        async def generate(self, prompt: Any, params: Any, request_id: str,
                           lora_request: Any = None, priority: int = 0,
                           timeout: float | None = None) -> Any:
            asked.append(priority)
            from strand.engine_core.outputs import CompletionOutput, RequestOutput

            yield RequestOutput(request_id, "p", [1], [CompletionOutput(
                0, "x", [2], finish_reason="stop")], True)

    async def run() -> None:
        jobs = [Job(f"r{i}", "p", SamplingParams(), None, priority=-3) for i in range(2)]
        await final_outputs(OutputStream(Client(), jobs), 2)  # type: ignore[arg-type]

    asyncio.run(run())
    assert asked == [-3, -3]


@pytest.mark.parametrize("details", [False, True])
def test_usage_has_the_cached_prompt_tokens_only_when_asked(details: bool) -> None:
    from strand.engine_core.outputs import CompletionOutput, RequestOutput
    from strand.services.openai.shaping import Shaper

    out = RequestOutput("r", "p", [1] * 40, [CompletionOutput(0, "x", [2], finish_reason="stop")],
                        True, num_cached_tokens=32)
    body = Shaper(chat=True, model="m", n=1, token_details=details).response([out])
    assert body["usage"]["prompt_tokens"] == 40
    assert body["usage"].get("prompt_tokens_details") == ({"cached_tokens": 32} if details
                                                          else None)
