"""Every client's Outbox (what waits for its next Step), the per-client bound, and the size of
one Step answer (a page)."""

from __future__ import annotations

import grpc

from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.status import StageError
from strand.services.gateway.clients import (
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_MAX_PENDING_OUTPUTS,
    DEFAULT_STEP_PAGE_BYTES,
    Outbox,
)

MIN_PAGE_BYTES = 1024
# A StepResponse's own framing and its num_pending field.
_RESPONSE_OVERHEAD = 16


class Outboxes:
    def __init__(self, max_step_page_bytes: int = DEFAULT_STEP_PAGE_BYTES,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 max_pending_outputs: int = DEFAULT_MAX_PENDING_OUTPUTS) -> None:
        if max_step_page_bytes < MIN_PAGE_BYTES:
            raise ValueError(f"max_step_page_bytes must be >= {MIN_PAGE_BYTES}, got "
                             f"{max_step_page_bytes}")
        # The largest Step answer (the gateway's own --max-message-bytes); a caller may ask less.
        self.max_step_page_bytes = max_step_page_bytes
        self.max_pending_bytes = max_pending_bytes
        self.max_pending_outputs = max_pending_outputs
        self._boxes: dict[str, Outbox] = {}

    def get(self, client: str) -> Outbox:
        box = self._boxes.get(client)
        if box is None:
            box = self._boxes[client] = Outbox()
        return box

    def is_over(self, client: str) -> bool:
        box = self._boxes.get(client)
        return box is not None and box.over(self.max_pending_bytes, self.max_pending_outputs)

    def over_reason(self, client: str) -> str:
        box = self.get(client)
        return (f"{len(box)} outputs ({box.num_bytes} bytes) wait for this client's Step, over "
                f"the bound of {self.max_pending_outputs} outputs / {self.max_pending_bytes} "
                f"bytes")

    def check_add(self, client: str) -> None:
        """RESOURCE_EXHAUSTED while the client's Outbox is over its bound."""
        if self.is_over(client):
            raise StageError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"{self.over_reason(client)}: call Step first")

    def page_bytes(self, max_response_bytes: int | None) -> int:
        """One Step answer's size: what the caller reads, within the gateway's limit."""
        if max_response_bytes is None or max_response_bytes <= 0:
            # What any stock gRPC client can read, unless the caller says it reads more.
            return min(self.max_step_page_bytes, DEFAULT_STEP_PAGE_BYTES)
        if max_response_bytes < MIN_PAGE_BYTES:
            raise StageError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"max_response_bytes must be >= {MIN_PAGE_BYTES}, got "
                             f"{max_response_bytes}")
        return min(max_response_bytes, self.max_step_page_bytes)

    def take_page(self, client: str, page: int, streamed: list[str]
                  ) -> tuple[list[pb.RequestOutput], list[pb.RequestOutput]]:
        """(the oldest of the client's outputs that fit one answer beside `streamed`, outputs
        too large for any answer: the caller ends their requests)."""
        head_room = _RESPONSE_OVERHEAD + sum(len(rid) + 6 for rid in streamed)
        return self.get(client).take_page(page - _RESPONSE_OVERHEAD, head_room)

    def forget_if_empty(self, client: str) -> None:
        """A client with nothing owed (and nothing running: the caller knows) is forgotten."""
        box = self._boxes.get(client)
        if box is not None and not box:
            del self._boxes[client]
