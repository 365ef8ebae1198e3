"""The engine's RequestOutputs of one HTTP request, as an async stream.

EngineClient.generate blocks, so each engine request runs its generate() in a thread that hands
outputs to the event loop. close() (the HTTP client went away, or the handler failed) aborts the
engine requests still running: a dropped stream must not keep the engine busy."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.trace import Span

from engine_core.outputs import RequestOutput
from engine_core.sampling_params import SamplingParams
from services.client import EngineClient
from services.common.convert import PromptType
from services.openai.tracing import in_span_context

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Job:
    request_id: str
    prompt: PromptType
    params: SamplingParams


# (job index, output), or (job index, None) when that job's stream ended.
_Item = tuple[int, RequestOutput | BaseException | None]


class OutputStream:
    def __init__(self, connect: Callable[[], EngineClient], jobs: list[Job],
                 span: Span | None = None) -> None:
        """span: the HTTP request's span; the gateway calls made for it are its children."""
        self._connect = connect
        self._span = span
        self._jobs = jobs
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._stop = threading.Event()
        self._running = set(range(len(jobs)))
        loop = asyncio.get_running_loop()
        for i, job in enumerate(jobs):
            threading.Thread(target=self._traced(self._run), args=(loop, i, job), daemon=True,
                             name=f"openai-{job.request_id}").start()

    def _run(self, loop: asyncio.AbstractEventLoop, index: int, job: Job) -> None:
        def put(item: RequestOutput | BaseException | None) -> None:
            loop.call_soon_threadsafe(self._queue.put_nowait, (index, item))

        try:
            with self._connect() as client:
                for output in client.generate(job.prompt, job.params, job.request_id):
                    if self._stop.is_set():
                        break  # closing generate() cancels the call
                    put(output)
        except BaseException as exc:  # noqa: BLE001 - handed to the HTTP handler
            put(exc)
        finally:
            try:
                put(None)
            except RuntimeError:
                pass  # the loop is gone (shutdown): nobody waits for this job

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
        if not self._running or self._stop.is_set():
            return
        self._stop.set()
        ids = [self._jobs[i].request_id for i in self._running]
        threading.Thread(target=self._traced(self._abort), args=(ids,), daemon=True).start()

    def _traced(self, target: Callable[..., None]) -> Callable[..., None]:
        return in_span_context(self._span, target) if self._span is not None else target

    def _abort(self, request_ids: list[str]) -> None:
        try:
            with self._connect() as client:
                client.abort_request(request_ids)
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
