"""The gateway's aborts on their way to the detokenizer, batched: at most one abort message is in
flight, and the ids that come while it is go together in the next one.

The detokenizer answers its Session in order, and an abort is answered only once the engine has
dropped the request, which happens between two steps. Sent one message per cancelled stream, a
storm of N cancels therefore took N engine steps to drain (seconds, while the engine computed
requests nobody would read); batched, it takes a step or two whatever N is.
"""

from __future__ import annotations

import asyncio

from strand.services._proto.strand.v1 import detokenizer_pb2 as dpb
from strand.services.common.stage_client import StageClient
from strand.services.common.tracing import carrier_from_context


class AbortBatches:
    def __init__(self, detokenizer: StageClient) -> None:
        self.detokenizer = detokenizer
        self._pending: list[str] = []  # ids for the next message
        self._next: asyncio.Future[None] | None = None  # done when the next message is answered
        self._sender: asyncio.Task[None] | None = None

    async def abort(self, request_ids: list[str]) -> None:
        """Have the detokenizer (and through it the engine) drop the requests; returns once both
        have (StageError when the detokenizer failed the batch they went in)."""
        if not request_ids:
            return
        loop = asyncio.get_running_loop()
        if self._next is None:
            self._next = loop.create_future()
        batch = self._next
        self._pending.extend(request_ids)
        if self._sender is None or self._sender.done():
            self._sender = loop.create_task(self._send_all())
        # Shielded: a caller that gives up does not take the batch's other ids with it.
        await asyncio.shield(batch)

    async def _send_all(self) -> None:
        while self._pending:
            ids, done = self._pending, self._next
            self._pending, self._next = [], None
            assert done is not None
            try:
                await self.detokenizer.call(dpb.DetokenizerRequest(
                    abort=dpb.DetokAbort(request_ids=ids), trace_context=carrier_from_context()))
            except asyncio.CancelledError:
                done.cancel()
                raise
            except Exception as exc:
                done.set_exception(exc)
                done.exception()  # retrieved: a batch whose callers all left logs nothing
            else:
                done.set_result(None)
