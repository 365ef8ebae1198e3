"""The gateway's subscription to the detokenizer's outputs for its own requests (its origin),
kept open (reconnecting) for as long as the gateway runs. Each batch goes to `on_batch`; when the
subscription breaks, `on_lost` is told why, once, and a new one is opened."""

from __future__ import annotations

import logging
from collections.abc import Callable

from strand.services._proto.strand.v1 import detokenizer_pb2 as dpb
from strand.services.common.stage_client import StageClient
from strand.services.common.subscriber import Subscriber

logger = logging.getLogger(__name__)

class OutputFeed(Subscriber):
    def __init__(self, detokenizer: StageClient, origin: str,
                 on_batch: Callable[[dpb.OutputBatch], None],
                 on_lost: Callable[[str], None]) -> None:
        super().__init__(detokenizer)
        self.origin = origin
        self._on_batch = on_batch
        self._on_lost = on_lost

    method = "Outputs"

    def request(self) -> dpb.DetokOutputsRequest:
        return dpb.DetokOutputsRequest(origin=self.origin)

    async def on_message(self, msg: dpb.OutputBatch) -> None:
        self._on_batch(msg)

    def on_lost(self, detail: str, was_subscribed: bool) -> None:
        if was_subscribed:
            reason = f"detokenizer stage is unavailable: {detail}"
            logger.warning("%s", reason)
            self._on_lost(reason)
