"""Server bootstrap shared by the four services: grpc.aio, health, reflection, auth, TLS, signals."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from strand.services.common.errors import UserError
from strand.services.common.gc_heap import freeze_startup_heap
from strand.services.common.link_server import LinkRegistry, LinkServer
from strand.services.common.metrics_server import check_metrics_port, start_metrics_server
from strand.services.common.rpc_drain import drain_cancelled_rpcs
from strand.services.common.stage_auth import STAGES, stage_api_key
from strand.services.common.stage_protocol import PROTOCOL_HEADER, protocol_mismatch
from strand.services.common.tracing import init_tracing, shutdown_tracing
from strand.services.common.undecodable import UndecodableInterceptor

logger = logging.getLogger(__name__)

# Internal streams carry one whole engine step (every request's tokens and logprobs).
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024**2
_OPEN_METHODS = ("/grpc.health.v1.", "/grpc.reflection.")
# grpc.health.v1 service names: liveness is "" and "liveness" (the process answers); readiness is
# "readiness" and each served service's full name (the model is loaded and every stage of the
# ring this one needs is connected).
LIVENESS = "liveness"
READINESS = "readiness"
_READINESS_POLL_S = 0.2
# Liveness between stages: a stage's client pings each stage it talks to every KEEPALIVE_TIME_MS
# and drops the connection when a ping goes unanswered for KEEPALIVE_TIMEOUT_MS. A frozen stage
# (SIGSTOP, a hung host) answers none, so its calls and subscriptions fail as UNAVAILABLE within
# about 5 s instead of waiting forever on a connection that is open but dead. (Pings are
# answered by gRPC's own I/O threads, not the stage's Python: a busy stage still answers.)
KEEPALIVE_TIME_MS = 2000
KEEPALIVE_TIMEOUT_MS = 3000
# Calls gRPC C-core has accepted but the server's Python has not yet picked up. C-core's own
# defaults (1000 soft, 3000 hard) drop calls beyond the soft limit at random with a bare
# CANCELLED and no message, before any handler (so before admission control could answer
# RESOURCE_EXHAUSTED): 4000 streams opened in one instant lost about a quarter that way. The
# queue is bounded here well above what admission control lets in, so overload is answered by
# the handlers; a call costs C-core a few KiB while it waits.
DEFAULT_MAX_PENDING_CALLS = 16384
# Seconds the calls and linked streams in flight get to end when a stage stops.
STOP_GRACE_S = 2.0


@dataclass(slots=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (printed once bound)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    api_key: str | None = None  # clients send `authorization: Bearer <key>`
    tls_cert: str | None = None
    tls_key: str | None = None
    otlp_traces_endpoint: str | None = None
    metrics_port: int | None = None  # Prometheus /metrics on this port of host; 0/None: off
    max_pending_calls: int = DEFAULT_MAX_PENDING_CALLS  # accepted, not yet handled


def add_server_args(parser: argparse.ArgumentParser, default_port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface to bind (loopback unless told otherwise)")
    parser.add_argument("--port", type=int, default=default_port)
    parser.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--tls-cert", default=None)
    parser.add_argument("--tls-key", default=None)
    if not any(a.dest == "otlp_traces_endpoint" for a in parser._actions):
        parser.add_argument("--otlp-traces-endpoint", default=None)
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (HOST is "
                             "--host); 0 or absent: off")
    parser.add_argument("--max-pending-calls", type=int, default=DEFAULT_MAX_PENDING_CALLS,
                        help="calls the transport holds before a handler takes them; beyond "
                             "it gRPC cancels new calls (default %(default)s)")


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("tls_cert and tls_key must be given together")
    check_metrics_port(args.metrics_port)
    if args.max_pending_calls < 1:
        raise ValueError(f"max_pending_calls must be >= 1, got {args.max_pending_calls}")
    return ServerOptions(host=args.host, port=args.port, max_message_bytes=args.max_message_bytes,
                         api_key=args.api_key, tls_cert=args.tls_cert, tls_key=args.tls_key,
                         otlp_traces_endpoint=args.otlp_traces_endpoint,
                         metrics_port=args.metrics_port,
                         max_pending_calls=args.max_pending_calls)


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes)]


def grpc_server_options(options: ServerOptions) -> list[tuple[str, int]]:
    """The C-core settings every stage's server runs with."""
    # Only what clients send is capped by max_message_bytes: a large answer (one step of many
    # requests) must never be refused, or its outputs would be lost.
    return [("grpc.max_receive_message_length", options.max_message_bytes),
            ("grpc.max_send_message_length",
             max(options.max_message_bytes, DEFAULT_MAX_MESSAGE_BYTES)),
            # gRPC sets SO_REUSEPORT by default: a second stack would then bind the
            # same port silently and the kernel would share connections between them.
            ("grpc.so_reuseport", 0),
            # Accept the stage clients' liveness pings (gRPC's default would answer
            # pings this frequent with GOAWAY "too_many_pings").
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms",
             KEEPALIVE_TIME_MS // 2),
            ("grpc.http2.max_ping_strikes", 0),
            # One limit, soft = hard: no random early drop below it.
            ("grpc.server.max_pending_requests", options.max_pending_calls),
            ("grpc.server.max_pending_requests_hard_limit", options.max_pending_calls)]


def keepalive_channel_options() -> list[tuple[str, int]]:
    """A stage client's pings (see KEEPALIVE_TIME_MS), also while no call is open."""
    return [("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS)]


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for any call without the bearer token (health and reflection stay open)."""

    def __init__(self, api_key: str) -> None:
        self._expected = f"Bearer {api_key}".encode()

    async def intercept_service(self, continuation: Callable[..., Awaitable[grpc.RpcMethodHandler]],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method: str = details.method  # type: ignore[attr-defined]
        metadata = dict(details.invocation_metadata or ())  # type: ignore[attr-defined]
        given = metadata.get("authorization", "")
        given = given if isinstance(given, bytes) else given.encode()
        # compare_digest: the time taken does not tell how much of a guessed key was right.
        if method.startswith(_OPEN_METHODS) or hmac.compare_digest(given, self._expected):
            return await continuation(details)
        handler = await continuation(details)
        return _rejecting_handler(handler)


class ProtocolInterceptor(grpc.aio.ServerInterceptor):
    """FAILED_PRECONDITION for a caller that speaks another stage protocol: a stage of another
    Strand version (stage_protocol.py). Callers that say none are served."""

    def __init__(self, stage: str) -> None:
        self._stage = stage

    async def intercept_service(self, continuation: Callable[..., Awaitable[grpc.RpcMethodHandler]],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        metadata = dict(details.invocation_metadata or ())  # type: ignore[attr-defined]
        error = protocol_mismatch(self._stage, metadata.get(PROTOCOL_HEADER))
        handler = await continuation(details)
        if error is None:
            return handler
        return _rejecting_handler(handler, grpc.StatusCode.FAILED_PRECONDITION, error)


def _rejecting_handler(handler: grpc.RpcMethodHandler | None,
                       code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED,
                       message: str = "missing or wrong api key: send metadata "
                                      "'authorization: Bearer <key>'") -> grpc.RpcMethodHandler:
    async def reject(request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    async def reject_stream(request: object, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    if handler is not None and handler.response_streaming:
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(reject_stream)
        return grpc.unary_stream_rpc_method_handler(reject_stream)
    if handler is not None and handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(reject)
    return grpc.unary_unary_rpc_method_handler(reject)


async def run_server(name: str, options: ServerOptions,
                     register: Callable[[grpc.aio.Server], Sequence[str]],
                     on_stop: Callable[[], Awaitable[None]] | None = None,
                     on_started: Callable[[int], Awaitable[None]] | None = None,
                     ready: Callable[[], bool] | None = None,
                     metrics: CollectorRegistry | None = None,
                     on_stopping: Callable[[], None] | None = None,
                     drain: Callable[[asyncio.Event], Awaitable[object]] | None = None) -> None:
    """Serve until SIGINT/SIGTERM. `register` adds the servicers and returns their full names;
    `ready` (polled) says whether this stage's part of the ring is connected; `metrics` is
    served on options.metrics_port. `drain` runs first on a stop, readiness already NOT_SERVING
    (its event is set by a second signal: end the drain now); `on_stopping` runs as the stop
    begins, before the calls in flight are given their grace; `on_stop` after it."""
    init_tracing(f"strand-{name}", options.otlp_traces_endpoint)
    api_key = stage_api_key(name, options.host, options.api_key)
    interceptors: list[grpc.aio.ServerInterceptor] = [ApiKeyInterceptor(api_key)] if api_key else []
    if name in STAGES:  # after the key: an unauthenticated caller learns nothing more
        interceptors.append(ProtocolInterceptor(name))
    interceptors.append(UndecodableInterceptor())
    server = grpc.aio.server(interceptors=interceptors, options=grpc_server_options(options))
    registry = LinkRegistry(server)
    names = list(register(registry))  # type: ignore[arg-type] # it passes everything on
    # The internal stages also serve their streams to callers on this host over a Unix socket
    # (stage_link.py); the gateway's clients always get gRPC.
    link = LinkServer(name, registry.handlers if name in STAGES else {}, api_key,
                      options.max_message_bytes)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME], server)
    address = f"{options.host}:{options.port}"
    try:
        if options.tls_cert and options.tls_key:
            with open(options.tls_key, "rb") as k, open(options.tls_cert, "rb") as c:
                creds = grpc.ssl_server_credentials([(k.read(), c.read())])
            port = server.add_secure_port(address, creds)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc's "Failed to bind to address ..."
        raise UserError(f"{name}: cannot listen on {address} (the port is in use, or the host "
                        f"is not a local address); choose another with --port") from exc
    # The link first: a caller that finds the gRPC port open finds the link too (it would
    # otherwise settle on gRPC for the life of a long-lived stream).
    await link.start(port)
    await server.start()
    metrics_server = start_metrics_server(name, options.host, options.metrics_port, metrics)
    for service in ("", LIVENESS):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    print(f"strand {name} listening on {options.host}:{port}", flush=True)
    if on_started is not None:
        await on_started(port)
    freeze_startup_heap(name)  # the model and libraries are loaded: out of the GC's passes
    readiness = asyncio.get_running_loop().create_task(
        _track_readiness(health_servicer, [READINESS, *names], ready))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("%s: stopping", name)
    readiness.cancel()
    if drain is not None:
        # Readiness first and at once: a load balancer stops sending while the calls in flight
        # go on (liveness stays SERVING).
        with contextlib.suppress(asyncio.CancelledError):
            await readiness  # it must not set SERVING again
        for service in (READINESS, *names):
            await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        stop.clear()
        await drain(stop)
    if on_stopping is not None:
        on_stopping()
    await health_servicer.enter_graceful_shutdown()
    # The same grace on both transports: a stage stopping beside this one (the engine and the
    # detokenizer stop together) closes its streams itself instead of seeing this one vanish.
    await asyncio.gather(link.close(grace=STOP_GRACE_S), server.stop(grace=STOP_GRACE_S))
    still_running = await drain_cancelled_rpcs()
    if still_running:
        logger.warning("%s: %d call handlers still running after the stop", name, still_running)
    if on_stop is not None:
        await on_stop()
    if metrics_server is not None:
        metrics_server.stop()
    shutdown_tracing()


async def _track_readiness(health_servicer: health.aio.HealthServicer, services: list[str],
                           ready: Callable[[], bool] | None) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    current: int | None = None
    while True:
        status = serving if ready is None or ready() else not_serving
        if status != current:
            for service in services:
                await health_servicer.set(service, status)
            current = status
        await asyncio.sleep(_READINESS_POLL_S)
