"""The stage link's wire format: frames of (kind, length, payload) over a Unix socket.

A stream is one connection. The caller's first frame is HELLO (JSON: the method's full path and
its `authorization` value); after it both sides send MESSAGE frames (one serialised protobuf
each). The stage ends the stream with END (JSON: a gRPC status code name and details). The caller
sends PING when it has heard nothing for a while and the stage answers PONG, so a frozen stage
is noticed as gRPC's keepalive notices it.
"""

from __future__ import annotations

import asyncio
import json
import struct
from enum import IntEnum

import grpc


class Kind(IntEnum):
    HELLO = 0
    MESSAGE = 1
    END = 2
    PING = 3
    PONG = 4


HEADER = struct.Struct(">BI")
# A HELLO or END frame is a few hundred bytes; anything larger is not a Strand peer.
CONTROL_FRAME_LIMIT = 64 * 1024


class FrameTooLarge(Exception):  # noqa: N818 - a condition the reader reports, named for it
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"a {size}-byte frame is over the {limit}-byte limit")
        self.size = size
        self.limit = limit


def link_address(port: int) -> str:
    """The abstract Unix socket a stage listening on TCP `port` also serves its link on. Abstract
    names live in the network namespace, as the port does, and vanish with the process (no stale
    file after a crash)."""
    return f"\0strand-stage-{port}"


async def read_frame(reader: asyncio.StreamReader, limit: int) -> tuple[Kind, bytes]:
    """The next frame; IncompleteReadError at the end of the connection, FrameTooLarge past
    `limit` (before its payload is read), ValueError for an unknown kind."""
    kind, size = HEADER.unpack(await reader.readexactly(HEADER.size))
    bound = limit if kind == Kind.MESSAGE else CONTROL_FRAME_LIMIT
    if size > bound:
        raise FrameTooLarge(size, bound)
    return Kind(kind), await reader.readexactly(size)


def write_frame(writer: asyncio.StreamWriter, kind: Kind, payload: bytes = b"") -> None:
    writer.writelines((HEADER.pack(kind, len(payload)), payload))


def json_frame(fields: dict[str, str]) -> bytes:
    return json.dumps(fields).encode()


def end_frame(code: grpc.StatusCode, details: str = "") -> bytes:
    return json_frame({"code": code.name, "details": details})


def parse_end(payload: bytes) -> tuple[grpc.StatusCode, str]:
    """END's status; an unreadable one is INTERNAL, naming what came."""
    try:
        fields = json.loads(payload)
        return grpc.StatusCode[fields["code"]], str(fields.get("details", ""))
    except (ValueError, KeyError, TypeError):
        return grpc.StatusCode.INTERNAL, f"unreadable end of stream: {payload[:80]!r}"
