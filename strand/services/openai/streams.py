"""The engine's RequestOutputs of one HTTP request, as an async stream.

Each engine request is a task iterating AsyncEngineClient.generate on the front's one client,
handing its outputs to one queue. close() (the HTTP client went away, or the handler failed)
cancels the tasks still running, which cancels their calls (the gateway aborts a request whose
stream is cancelled), and aborts those requests as well: a dropped stream must not keep the
engine busy."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services.async_client import AsyncEngineClient
from strand.services.common.convert import PromptType

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Job:
    request_id: str
    prompt: PromptType
    params: SamplingParams
    lora_request: LoRARequest | None = None  # the model name was a --lora-modules adapter
    priority: int = 0  # vLLM's request priority (--scheduling-policy priority)
    timeout_s: float | None = None  # the client's wait (client_timeout.py): the call's deadline


# (job index, output), or (job index, None) when that job's stream ended.
_Item = tuple[int, RequestOutput | BaseException | None]


class OutputStream:
    def __init__(self, client: AsyncEngineClient, jobs: list[Job],
                 span: Span | None = None) -> None:
        """span: the HTTP request's span; the gateway calls made for it are its children."""
        self._client = client
        self._span = span
        self._jobs = jobs
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._running = set(range(len(jobs)))
        self._closed = False
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(i, job)) for i, job in enumerate(jobs)]

    async def _run(self, index: int, job: Job) -> None:
        try:
            with self._in_span():
                async for output in self._client.generate(job.prompt, job.params,
                                                          job.request_id,
                                                          lora_request=job.lora_request,
                                                          priority=job.priority,
                                                          timeout=job.timeout_s):
                    self._queue.put_nowait((index, output))
        except asyncio.CancelledError:
            raise  # close(): nobody reads this stream any more
        except BaseException as exc:  # noqa: BLE001 - handed to the HTTP handler
            self._queue.put_nowait((index, exc))
        finally:
            self._queue.put_nowait((index, None))

    def _in_span(self) -> AbstractContextManager[Any]:
        """The HTTP request's span as the current one: its trace context goes to the gateway."""
        if self._span is None:
            return nullcontext()
        return trace.use_span(self._span, end_on_exit=False)

    def __aiter__(self) -> OutputStream:
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        while self._running:
            index, item = await self._queue.get()
            if item is None:
                self._running.discard(index)
            elif isinstance(item, BaseException):
                raise item
            else:
                return index, item
        raise StopAsyncIteration

    def close(self) -> None:
        """Abort what still runs (synchronous: safe in a cancelled task's finally)."""
        if not self._running or self._closed:
            return
        self._closed = True
        ids = [self._jobs[i].request_id for i in self._running]
        for task in self._tasks:
            task.cancel()
        asyncio.get_running_loop().create_task(self._abort(ids))

    async def _abort(self, request_ids: list[str]) -> None:
        try:
            with self._in_span():
                await self._client.abort_request(request_ids)
        except Exception as exc:  # noqa: BLE001 - the gateway may be gone; nothing to abort then
            log.warning("could not abort %s: %s", request_ids, exc)


async def final_outputs(stream: OutputStream, num_jobs: int) -> list[RequestOutput]:
    """Non-streaming: the last RequestOutput of each job, in job order."""
    last: list[RequestOutput | None] = [None] * num_jobs
    try:
        async for index, output in stream:
            last[index] = output
    finally:
        stream.close()
    missing = [i for i, o in enumerate(last) if o is None]
    if missing:
        raise RuntimeError(f"the engine returned no output for prompt {missing[0]}")
    return [o for o in last if o is not None]
