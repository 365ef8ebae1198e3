"""One request's outputs between a producer and a consumer that may lag (vLLM's
RequestOutputCollector, from its AsyncLLM).

The producer puts every output as it comes and never waits; the consumer gets whatever gathered
since its last get. While the consumer lags, outputs merge instead of queueing: DELTA ones append
(text, token ids, logprobs: nothing is lost), CUMULATIVE and FINAL_ONLY ones replace the older
(each carries everything). A slow reader then holds one output, not a backlog as long as its
generation, and catches up in one read. An exception put ends the stream: get raises it.

The gateway keeps one per Generate stream (strand/services/gateway/stream_outputs.py), on its messages.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import RequestOutputKind

T = TypeVar("T")


class OutputCollector(Generic[T]):
    def __init__(self, aggregate: bool) -> None:
        self.aggregate = aggregate  # DELTA outputs: append while the consumer lags
        self.output: T | BaseException | None = None  # what the next get returns
        self.ready = asyncio.Event()

    def put(self, output: T | BaseException) -> None:
        pending = self.output
        if pending is None or isinstance(output, BaseException):
            self.output = output
            self.ready.set()
        elif not isinstance(pending, BaseException):  # after an error nothing more counts
            self.output = self.merge(pending, output)

    async def get(self) -> T:
        """The next output (everything since the last get), waiting for one."""
        while self.output is None:
            await self.ready.wait()
        output = self.get_nowait()
        assert output is not None
        return output

    def get_nowait(self) -> T | None:
        """What gathered since the last get, or None."""
        output, self.output = self.output, None
        self.ready.clear()
        if isinstance(output, BaseException):
            raise output
        return output

    def merge(self, pending: T, later: T) -> T:
        """pending followed by later, as one output (see the module docstring)."""
        raise NotImplementedError


class RequestOutputCollector(OutputCollector[RequestOutput]):
    def __init__(self, output_kind: RequestOutputKind, request_id: str = "") -> None:
        super().__init__(aggregate=output_kind == RequestOutputKind.DELTA)
        self.request_id = request_id

    def merge(self, pending: RequestOutput, later: RequestOutput) -> RequestOutput:
        pending.add(later, aggregate=self.aggregate)
        return pending
