"""The floor under the ring's latency: one gRPC stream message between two Python processes.

A second process runs a grpc.aio echo on a bidirectional stream (the shape of every edge of the
ring) and stamps each message with CLOCK_MONOTONIC when its handler sees it; this process stamps
it before the write. The difference is one hop: the sender's write, the kernel, and the
receiver's gRPC threads and event loop, with no Strand code on either side. Measured two ways:
back to back (both processes busy, their threads awake) and after an idle gap (as a lone request
finds the stages: each waiting on its socket, gRPC's threads asleep), which is the case a low-load
request's time to first token pays once per hop.

A plain asyncio socket echo is measured beside it, after the same gap: what the kernel and one
event loop cost, so the rest is gRPC's own thread hand-offs.

    python -m benchmarks.grpc_hop --messages 300 --gap-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

import grpc

_METHOD = "/strand.bench.Hop/Echo"
_PAYLOAD = b"x" * 100  # about one small stage message


def _raw(data: bytes) -> bytes:
    return data


def _stamp() -> bytes:
    return time.monotonic_ns().to_bytes(8, "little")


async def _serve_grpc(port: int) -> None:
    async def echo(messages: Any, context: grpc.aio.ServicerContext) -> Any:
        async for _ in messages:
            yield _stamp()

    handler = grpc.method_handlers_generic_handler("strand.bench.Hop", {
        "Echo": grpc.stream_stream_rpc_method_handler(echo, request_deserializer=_raw,
                                                      response_serializer=_raw)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def _serve_socket(port: int) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readexactly(len(_PAYLOAD))
                writer.write(_stamp())
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


async def _grpc_hops(port: int, count: int, gap_s: float) -> list[float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(_METHOD, request_serializer=_raw,
                                     response_deserializer=_raw)()
        hops = []
        for i in range(count + 20):  # the first 20 warm the connection
            if gap_s:
                await asyncio.sleep(gap_s)
            sent = time.monotonic_ns()
            await call.write(_PAYLOAD)
            seen = int.from_bytes(await call.read(), "little")
            if i >= 20:
                hops.append((seen - sent) / 1e6)
        await call.done_writing()
        return hops


async def _socket_hops(port: int, count: int, gap_s: float) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    hops = []
    for i in range(count + 20):
        if gap_s:
            await asyncio.sleep(gap_s)
        sent = time.monotonic_ns()
        writer.write(_PAYLOAD)
        await writer.drain()
        seen = int.from_bytes(await reader.readexactly(8), "little")
        if i >= 20:
            hops.append((seen - sent) / 1e6)
    writer.close()
    return hops


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_server(kind: str, measure: Any) -> list[float]:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.grpc_hop", "--serve", kind,
                               "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {kind} echo server did not start")
        return asyncio.run(measure(port))
    finally:
        server.kill()
        server.wait()


def measure_hops(count: int = 300, gap_ms: float = 20.0) -> dict[str, float]:
    """p50 one-way milliseconds: gRPC back to back, gRPC after the gap, a socket after it."""
    if count < 1 or gap_ms < 0:
        raise ValueError(f"count must be >= 1 and gap_ms >= 0, got {count} and {gap_ms}")
    gap = gap_ms / 1e3
    return {
        "grpc_busy_ms": statistics.median(_with_server(
            "grpc", lambda port: _grpc_hops(port, count, 0.0))),
        "grpc_after_gap_ms": statistics.median(_with_server(
            "grpc", lambda port: _grpc_hops(port, count, gap))),
        "socket_after_gap_ms": statistics.median(_with_server(
            "socket", lambda port: _socket_hops(port, count, gap))),
        "gap_ms": gap_ms,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=20.0,
                        help="idle time before each message of the after-gap runs")
    parser.add_argument("--serve", choices=("grpc", "socket"), default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve_grpc(args.port) if args.serve == "grpc"
                    else _serve_socket(args.port))
        return
    if args.messages < 1:
        parser.error(f"--messages must be >= 1, got {args.messages}")
    if args.gap_ms < 0:
        parser.error(f"--gap-ms must be >= 0, got {args.gap_ms}")
    hops = measure_hops(args.messages, args.gap_ms)
    print(f"one gRPC stream message, p50: {hops['grpc_busy_ms']:.3f} ms back to back, "
          f"{hops['grpc_after_gap_ms']:.3f} ms after {args.gap_ms:g} ms idle; "
          f"a plain socket after the same idle: {hops['socket_after_gap_ms']:.3f} ms")


if __name__ == "__main__":
    main()
