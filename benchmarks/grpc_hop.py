"""The floor under the ring's latency: one gRPC stream message between two Python processes.

A server process runs a grpc.aio echo on a bidirectional stream (the shape of every edge of the
ring) and stamps each message with CLOCK_MONOTONIC when its handler sees it; a client process
stamps it before the write. The difference is one hop: the sender's write, the kernel, and the
receiver's gRPC threads and event loop, with no Strand code on either side. Measured two ways:
back to back (both processes busy, their threads awake) and after an idle gap (as a lone request
finds the stages: each waiting on its socket, gRPC's threads asleep), which is the case a low-load
request's time to first token pays once per hop.

Both processes start on gRPC's default (EventEngine) TCP path, the stages' default, and, in
alternating rounds, on its iomgr path (strand/services/grpc_tuning.py, STRAND_GRPC_IOMGR=1: one thread
wake-up fewer per message), since the choice is process-wide and read when grpc is imported. A plain asyncio
socket echo is measured beside them, after the same gap: what the kernel and one event loop cost,
so the rest is gRPC's own thread hand-offs. The default path is measured over a Unix socket too
(`unix:` addresses, which grpcio takes as they are): what the TCP stack costs of a hop. And the
stages' local link (strand/services/common/stage_link.py), its own server and call code, after the gap:
the hop the ring's internal edges take between stages on one host. Last, what a client's
request pays before any handler work: a new server-streaming call answered with one message, its
round trip after the gap (what a Generate costs on a bare grpc.aio server), and one message's
round trip on an open bidirectional stream (what a request would cost sent as a message on a
long-lived call instead).

    python -m benchmarks.grpc_hop --messages 300 --gap-ms 20 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from strand.services import grpc_tuning

_METHOD = "/strand.bench.Hop/Echo"
_PAYLOAD = b"x" * 100  # about one small stage message
_WARM = 20  # messages that warm the connection, not timed
_KINDS = ("grpc", "socket", "link", "grpc_call", "grpc_stream_trip")


def _raw(data: bytes) -> bytes:
    return data


def _stamp() -> bytes:
    return time.monotonic_ns().to_bytes(8, "little")


def _address(port: int, unix: str | None) -> str:
    return f"unix:{unix}" if unix else f"127.0.0.1:{port}"


async def _serve_grpc(port: int, unix: str | None = None) -> None:
    import grpc

    async def echo(messages: Any, context: grpc.aio.ServicerContext) -> Any:
        async for _ in messages:
            yield _stamp()

    async def answer(message: bytes, context: grpc.aio.ServicerContext) -> Any:
        yield _stamp()

    handler = grpc.method_handlers_generic_handler("strand.bench.Hop", {
        "Echo": grpc.stream_stream_rpc_method_handler(echo, request_deserializer=_raw,
                                                      response_serializer=_raw),
        "Call": grpc.unary_stream_rpc_method_handler(answer, request_deserializer=_raw,
                                                     response_serializer=_raw)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(_address(port, unix))
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


async def _timed(count: int, gap_s: float, echo: Callable[[], Awaitable[int]]) -> list[float]:
    """One-way ms of `count` messages (after _WARM untimed): `echo` sends one and returns the
    receiver's CLOCK_MONOTONIC stamp of it."""
    hops = []
    for i in range(count + _WARM):
        if gap_s:
            await asyncio.sleep(gap_s)
        sent = time.monotonic_ns()
        seen = await echo()
        if i >= _WARM:
            hops.append((seen - sent) / 1e6)
    return hops


async def _serve_link(port: int) -> None:
    import grpc

    from strand.services._proto.strand.v1 import engine_pb2 as epb
    from strand.services.common.link_server import LinkServer

    async def echo(messages: Any, context: Any) -> Any:
        async for _ in messages:
            yield epb.EngineResponse(seq=time.monotonic_ns())

    handler = grpc.stream_stream_rpc_method_handler(
        echo, request_deserializer=epb.EngineRequest.FromString,
        response_serializer=epb.EngineResponse.SerializeToString)
    server = LinkServer("bench", {_METHOD: handler}, None, 1 << 20)
    await server.start(port)
    print("ready", flush=True)
    await asyncio.Event().wait()


async def _link_hops(port: int, count: int, gap_s: float) -> list[float]:
    from strand.services._proto.strand.v1 import engine_pb2 as epb
    from strand.services.common.link_call import LinkCall

    call = await LinkCall.open(port, _METHOD, None, epb.EngineResponse, None, 1 << 20, 5.0)
    request = epb.EngineRequest(seq=1, abort=epb.EngineAbort(request_ids=["x" * 90]))

    async def echo() -> int:
        await call.write(request)
        return int((await call.read()).seq)
    hops = await _timed(count, gap_s, echo)
    call.cancel()
    return hops


async def _grpc_hops(port: int, count: int, gap_s: float, unix: str | None = None
                     ) -> list[float]:
    import grpc

    async with grpc.aio.insecure_channel(_address(port, unix)) as channel:
        call = channel.stream_stream(_METHOD, request_serializer=_raw,
                                     response_deserializer=_raw)()

        async def echo() -> int:
            await call.write(_PAYLOAD)
            return int.from_bytes(await call.read(), "little")
        hops = await _timed(count, gap_s, echo)
        await call.done_writing()
        return hops


async def _grpc_calls(port: int, count: int, gap_s: float) -> list[float]:
    """Round trips (not one way) of new server-streaming calls, each answered once."""
    import grpc

    async with grpc.aio.insecure_channel(_address(port, None)) as channel:
        call = channel.unary_stream(_METHOD.replace("Echo", "Call"), request_serializer=_raw,
                                    response_deserializer=_raw)
        trips = []
        for i in range(count + _WARM):
            if gap_s:
                await asyncio.sleep(gap_s)
            sent = time.monotonic_ns()
            async for _ in call(_PAYLOAD):
                pass
            if i >= _WARM:
                trips.append((time.monotonic_ns() - sent) / 1e6)
        return trips


async def _grpc_stream_trips(port: int, count: int, gap_s: float) -> list[float]:
    """Round trips (not one way) of one message each on an open bidirectional stream: what a
    request sent on a long-lived call would cost before any handler work."""
    import grpc

    async with grpc.aio.insecure_channel(_address(port, None)) as channel:
        call = channel.stream_stream(_METHOD, request_serializer=_raw,
                                     response_deserializer=_raw)()
        trips = []
        for i in range(count + _WARM):
            if gap_s:
                await asyncio.sleep(gap_s)
            sent = time.monotonic_ns()
            await call.write(_PAYLOAD)
            await call.read()
            if i >= _WARM:
                trips.append((time.monotonic_ns() - sent) / 1e6)
        await call.done_writing()
        return trips


async def _socket_hops(port: int, count: int, gap_s: float) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def echo() -> int:
        writer.write(_PAYLOAD)
        await writer.drain()
        return int.from_bytes(await reader.readexactly(8), "little")
    hops = await _timed(count, gap_s, echo)
    writer.close()
    return hops


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(transport: str) -> dict[str, str]:
    """The environment both processes start with (GRPC_EXPERIMENTS is read once, at grpc's first
    import): "default" with no tuning, "iomgr" as STRAND_GRPC_IOMGR=1 sets it."""
    env = {k: v for k, v in os.environ.items()
           if k not in (grpc_tuning.ENV, grpc_tuning.OPT_IN_ENV)}
    if transport == "iomgr":
        env[grpc_tuning.OPT_IN_ENV] = "1"
        grpc_tuning.apply(env)
    return env


def _hops(kind: str, transport: str, count: int, gap_ms: float, unix: bool = False,
          client: str | None = None) -> float:
    """p50 one-way ms of `count` messages, server and client each a fresh process (over a
    Unix socket where `unix`; the client `client` where it is not the server's kind)."""
    port = _free_port()
    me = [sys.executable, "-m", "benchmarks.grpc_hop", "--port", str(port)]
    socket_dir = tempfile.TemporaryDirectory(prefix="strand-hop-") if unix else None
    if socket_dir is not None:
        me += ["--unix", os.path.join(socket_dir.name, "hop.sock")]
    env = _env(transport)
    server = subprocess.Popen([*me, "--serve", kind], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {kind} echo server did not start")
        out = subprocess.run([*me, "--client", client or kind, "--messages", str(count), "--gap-ms",
                              str(gap_ms)], capture_output=True, text=True, env=env, check=True)
        return statistics.median(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        server.kill()
        server.wait()
        if socket_dir is not None:
            socket_dir.cleanup()


def measure_hops(count: int = 300, gap_ms: float = 20.0, rounds: int = 1) -> dict[str, float]:
    """p50 one-way milliseconds (the median over rounds): gRPC on its default TCP path back to
    back and after the gap, the same on its iomgr path and over a Unix socket, a plain socket
    after the gap, the stages' local link after the gap; and round trips after the gap: a new
    server-streaming call's (grpc_new_call_ms), one message's on an open bidirectional stream
    (grpc_stream_round_trip_ms)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if gap_ms < 0:
        raise ValueError(f"gap_ms must be >= 0, got {gap_ms}")
    runs: dict[str, list[float]] = {}
    for _ in range(rounds):  # alternating, so a busy moment meets every variant alike
        for transport, prefix in (("default", "grpc"), ("iomgr", "grpc_iomgr")):
            runs.setdefault(f"{prefix}_busy_ms", []).append(_hops("grpc", transport, count, 0.0))
            runs.setdefault(f"{prefix}_after_gap_ms", []).append(
                _hops("grpc", transport, count, gap_ms))
        runs.setdefault("grpc_unix_busy_ms", []).append(
            _hops("grpc", "default", count, 0.0, unix=True))
        runs.setdefault("grpc_unix_after_gap_ms", []).append(
            _hops("grpc", "default", count, gap_ms, unix=True))
        runs.setdefault("socket_after_gap_ms", []).append(
            _hops("socket", "default", count, gap_ms))
        runs.setdefault("link_after_gap_ms", []).append(_hops("link", "default", count, gap_ms))
        runs.setdefault("grpc_new_call_ms", []).append(_hops("grpc", "default", count, gap_ms,
                                                             client="grpc_call"))
        runs.setdefault("grpc_stream_round_trip_ms", []).append(
            _hops("grpc", "default", count, gap_ms, client="grpc_stream_trip"))
    return {**{name: statistics.median(values) for name, values in runs.items()},
            "gap_ms": gap_ms, "rounds": rounds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=20.0,
                        help="idle time before each message of the after-gap runs")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds of every variant; medians over them")
    parser.add_argument("--serve", choices=_KINDS[:3], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--client", choices=_KINDS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--unix", default=None, help=argparse.SUPPRESS)  # a socket's path
    args = parser.parse_args(argv)
    if args.serve:
        servers = {"grpc": lambda: _serve_grpc(args.port, args.unix),
                   "socket": lambda: _serve_socket(args.port),
                   "link": lambda: _serve_link(args.port)}
        asyncio.run(servers[args.serve]())
        return
    if args.messages < 1:
        parser.error(f"--messages must be >= 1, got {args.messages}")
    if args.gap_ms < 0:
        parser.error(f"--gap-ms must be >= 0, got {args.gap_ms}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.client:
        gap_s = args.gap_ms / 1e3
        clients = {"grpc": lambda: _grpc_hops(args.port, args.messages, gap_s, args.unix),
                   "socket": lambda: _socket_hops(args.port, args.messages, gap_s),
                   "link": lambda: _link_hops(args.port, args.messages, gap_s),
                   "grpc_call": lambda: _grpc_calls(args.port, args.messages, gap_s),
                   "grpc_stream_trip": lambda: _grpc_stream_trips(args.port, args.messages,
                                                                  gap_s)}
        print(json.dumps(asyncio.run(clients[args.client]())))
        return
    hops = measure_hops(args.messages, args.gap_ms, args.rounds)
    print(f"one gRPC stream message, p50 over {args.rounds} rounds: "
          f"{hops['grpc_busy_ms']:.3f} ms back to back, {hops['grpc_after_gap_ms']:.3f} ms after "
          f"{args.gap_ms:g} ms idle on gRPC's default TCP path; on its iomgr path "
          f"(STRAND_GRPC_IOMGR=1): {hops['grpc_iomgr_busy_ms']:.3f} and "
          f"{hops['grpc_iomgr_after_gap_ms']:.3f} ms; over a Unix socket (default path): "
          f"{hops['grpc_unix_busy_ms']:.3f} and {hops['grpc_unix_after_gap_ms']:.3f} ms; "
          f"a plain socket after the same idle: "
          f"{hops['socket_after_gap_ms']:.3f} ms; the stages' local link after it: "
          f"{hops['link_after_gap_ms']:.3f} ms; a new server-streaming call answered once, "
          f"round trip after the idle: {hops['grpc_new_call_ms']:.3f} ms; one message on an "
          f"open stream, round trip after it: {hops['grpc_stream_round_trip_ms']:.3f} ms")


if __name__ == "__main__":
    main()
