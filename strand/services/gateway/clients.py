"""Requests belong to the client that added them.

A client's identity, in order:
1. the `x-strand-client` metadata value when the call sends one (EngineClient and the OpenAI
   front do: one value per EngineClient, one per front process, so a front's Abort on a fresh
   connection still reaches its requests). With an api key it is scoped under the key; without
   one it is a label that any caller can claim, so it keeps cooperating clients apart, not
   attackers (the api key is the security boundary);
2. else, with an api key, the key itself: every holder of the key is one client;
3. else the caller's connection (gRPC's peer address): a raw client (grpcurl, a bare stub) owns
   what it added over its connection.

Internally a request's id is `<client tag>.<id>` (the tag: a short hash of the identity), so two
clients may use the same id and ALREADY_EXISTS never reveals another client's ids. What waits for
a client's next Step lives in its Outbox, bounded: beyond the bound the client's Step-fed
requests are aborted with finish_reason "error" and a reason (never dropped silently), and its
adds are refused RESOURCE_EXHAUSTED until it calls Step.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.status import StageError

CLIENT_METADATA = "x-strand-client"
MAX_REQUEST_ID_CHARS = 256
MAX_CLIENT_CHARS = 128
# gRPC's default receive limit: a Step answer no larger than this reaches any stock client.
DEFAULT_STEP_PAGE_BYTES = 4 * 1024**2
# Per client, what may wait for its next Step before its Step-fed requests are aborted.
DEFAULT_MAX_PENDING_BYTES = 64 * 1024**2
DEFAULT_MAX_PENDING_OUTPUTS = 100_000
# A repeated message field's framing: a tag byte and a length varint (at most 5 bytes here).
_FIELD_OVERHEAD = 6


def client_identity(metadata: Sequence[tuple[str, str | bytes]], peer: str,
                    authenticated: bool) -> str:
    """The caller's identity (see the module docstring); INVALID_ARGUMENT for a bad label."""
    label = next((v for k, v in metadata if k == CLIENT_METADATA), None)
    if isinstance(label, bytes):
        label = label.decode("ascii", "replace")
    if label is not None:
        if not label or len(label) > MAX_CLIENT_CHARS or not all(" " <= c <= "~" for c in label):
            raise StageError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"metadata {CLIENT_METADATA} must be 1-{MAX_CLIENT_CHARS} printable "
                             f"ASCII characters, got {len(label)} characters")
        return f"key/{label}" if authenticated else f"label/{label}"
    return "key" if authenticated else f"peer/{peer}"


def check_request_id(request_id: str) -> None:
    """Ids travel as gRPC metadata (strand-request-id) and in logs: printable ASCII only, and
    bounded; checked before anything is added anywhere."""
    if not request_id:
        raise StageError(grpc.StatusCode.INVALID_ARGUMENT, "request_id must not be empty")
    shown = repr(request_id[:40]) + ("..." if len(request_id) > 40 else "")
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise StageError(grpc.StatusCode.INVALID_ARGUMENT,
                         f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters, got "
                         f"{len(request_id)} ({shown})")
    if not all(" " <= c <= "~" for c in request_id):
        raise StageError(grpc.StatusCode.INVALID_ARGUMENT,
                         f"request_id must be printable ASCII (0x20-0x7E), got {shown}")


def client_tag(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def internal_id(identity: str, request_id: str) -> str:
    return f"{client_tag(identity)}.{request_id}"


def output_bytes(output: pb.RequestOutput) -> int:
    return output.ByteSize() + _FIELD_OVERHEAD


@dataclass(slots=True)
class Outbox:
    """One client's outputs waiting for its next Step, oldest first, with their sizes."""

    waiting: deque[tuple[pb.RequestOutput, int]] = field(default_factory=deque)
    num_bytes: int = 0

    def __len__(self) -> int:
        return len(self.waiting)

    def put(self, output: pb.RequestOutput) -> None:
        size = output_bytes(output)
        self.waiting.append((output, size))
        self.num_bytes += size

    def over(self, max_bytes: int, max_outputs: int) -> bool:
        return self.num_bytes > max_bytes or len(self.waiting) > max_outputs

    def fits(self, page_bytes: int) -> bool:
        return self.num_bytes <= page_bytes

    def take_page(self, page_bytes: int, head_room: int
                  ) -> tuple[list[pb.RequestOutput], list[pb.RequestOutput]]:
        """(the oldest outputs that fit page_bytes - head_room together, in order; outputs that
        alone exceed a whole page and so can never be sent: the caller replaces them). The rest
        stay, in order."""
        page: list[pb.RequestOutput] = []
        oversized: list[pb.RequestOutput] = []
        used = head_room
        while self.waiting:
            output, size = self.waiting[0]
            if size > page_bytes:
                oversized.append(output)
            elif used + size > page_bytes:
                break
            else:
                page.append(output)
                used += size
            self.waiting.popleft()
            self.num_bytes -= size
        return page, oversized

    def discard(self, request_id: str) -> None:
        """Drop what waits for one request (it is being replaced by its "error" ending)."""
        self.waiting = deque(item for item in self.waiting if item[0].request_id != request_id)
        self.num_bytes = sum(size for _, size in self.waiting)
