"""Many calls opened in one instant all reach a handler: the stages' servers hold them in a queue
bounded by max_pending_calls instead of gRPC C-core's default (soft 1000, hard 3000), which drops
calls past the soft limit at random with a bare CANCELLED before admission control can answer."""

from __future__ import annotations

import asyncio
import collections

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strand.services.common.server import ServerOptions, grpc_server_options

_CHANNELS = 8


class _SlowWatch(health_pb2_grpc.HealthServicer):
    """Holds every stream open for a while, so the calls pile up as concurrent streams do."""

    async def Watch(self, request: health_pb2.HealthCheckRequest,  # type: ignore[override]
                    context: grpc.aio.ServicerContext) -> object:
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        await asyncio.sleep(0.5)


async def _open_at_once(options: ServerOptions, streams: int) -> collections.Counter[str]:
    server = grpc.aio.server(options=grpc_server_options(options))
    health_pb2_grpc.add_HealthServicer_to_server(_SlowWatch(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                          options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(_CHANNELS)]
    outcomes: collections.Counter[str] = collections.Counter()

    async def one(i: int) -> None:
        stub = health_pb2_grpc.HealthStub(channels[i % _CHANNELS])
        try:
            async for _ in stub.Watch(health_pb2.HealthCheckRequest()):
                pass
            outcomes["OK"] += 1
        except grpc.aio.AioRpcError as e:
            outcomes[e.code().name] += 1

    try:
        await asyncio.gather(*(one(i) for i in range(streams)))
    finally:
        for channel in channels:
            await channel.close()
        await server.stop(None)
    return outcomes


def test_thousands_of_calls_opened_at_once_all_reach_a_handler() -> None:
    # 3000 is past C-core's default soft limit: with its defaults several hundred end CANCELLED.
    outcomes = asyncio.run(_open_at_once(ServerOptions(), 3000))
    assert outcomes == {"OK": 3000}


def test_max_pending_calls_bounds_the_queue() -> None:
    # The bound is real: far more calls than it at once, and the transport cancels the rest.
    outcomes = asyncio.run(_open_at_once(ServerOptions(max_pending_calls=20), 400))
    assert outcomes["CANCELLED"] > 0 and outcomes["OK"] > 0
