"""`python -m tests.services.common.silent_stage`: an engine stage that reads every Session message
and answers none (a stage that is up but stuck), on the shared server bootstrap. Prints its port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from strand.services._proto.strand.v1 import engine_pb2, engine_pb2_grpc
from strand.services.common.server import ServerOptions, run_server


class SilentEngine(engine_pb2_grpc.EngineServicer):
    async def Session(self, request_iterator: AsyncIterator[Any],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for _ in request_iterator:
            pass
        if False:  # pragma: no cover - makes this an async generator that never yields
            yield engine_pb2.EngineResponse()


def main() -> None:
    def register(server: grpc.aio.Server) -> list[str]:
        engine_pb2_grpc.add_EngineServicer_to_server(SilentEngine(), server)
        return [engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name]

    asyncio.run(run_server("engine", ServerOptions(), register))


if __name__ == "__main__":
    main()
