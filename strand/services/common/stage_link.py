"""Which transport a stage edge takes: the local link to a stage on this host, gRPC otherwise.

Why a link: on one host the ring's internal edges need none of HTTP/2, and grpc.aio pays for
every message twice over, in CPU (its completion-queue thread, then the event loop's callbacks)
and in a second thread wake-up. A chain of three relays took about twice the time per round
over grpc.aio bidi streams as over these frames, and about twice the CPU per relayed message.
The link carries the same
protobuf messages to the same handlers (`link_server.py`), checks the same stage token and
message size, and pings as gRPC's keepalive does (with a longer timeout: the stage's event loop
answers, not gRPC's threads; link_call.py); the gateway's public API stays gRPC.

`STRAND_STAGE_TRANSPORT=grpc` keeps every edge on gRPC (to compare, or to rule the link out).
Stages on other hosts or in other network namespaces (containers, pods) always talk gRPC.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message_factory import GetMessageClass

from strand import envs
from strand.services._proto.strand.v1 import detokenizer_pb2, engine_pb2, tokenizer_pb2

TRANSPORT_ENV = "STRAND_STAGE_TRANSPORT"
TRANSPORTS = ("auto", "grpc")
# Targets that can only mean this host (a stack launched with --host 0.0.0.0 gives its stages
# "0.0.0.0:PORT").
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::")
_SERVICES = {"tokenizer": tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"],
             "engine": engine_pb2.DESCRIPTOR.services_by_name["Engine"],
             "detokenizer": detokenizer_pb2.DESCRIPTOR.services_by_name["Detokenizer"]}


def transport() -> str:
    value = envs.stage_transport()
    if value not in TRANSPORTS:
        raise ValueError(f"{TRANSPORT_ENV} must be one of {', '.join(TRANSPORTS)}, got {value!r}")
    return value


def link_port(target: str) -> int | None:
    """The port whose link serves `target` (host:port), or None when the edge takes gRPC."""
    host, _, port = target.rpartition(":")
    if host.strip("[]") not in _LOCAL_HOSTS or not port.isdigit() or transport() == "grpc":
        return None
    return int(port)


def stream_method(stage: str, name: str) -> tuple[str, Any]:
    """A stage's streaming method: its full path and its answers' message class."""
    method = _SERVICES[stage].methods_by_name[name]
    return f"/{method.containing_service.full_name}/{name}", GetMessageClass(method.output_type)
