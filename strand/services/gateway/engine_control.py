"""strand.v1.Control's engine-wide calls on the gateway: sleep and wake, profiling, supported
tasks. Each RPC is one EngineRequest on the gateway's engine session, between steps (as in
process), answered from the EngineState the engine returns."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.gateway.flow import GatewayFlow

T = TypeVar("T")
ENGINE_CONTROL_METHODS = frozenset({"Sleep", "WakeUp", "IsSleeping", "StartProfile",
                                    "StopProfile", "GetSupportedTasks"})


class EngineControlRpcs:
    """Mixed into GatewayServicer, which supplies flow and _traced."""

    flow: GatewayFlow
    _traced: Callable[[str, grpc.aio.ServicerContext, Callable[[], Awaitable[T]]], Awaitable[T]]

    async def Sleep(self, request: cpb.SleepRequest,
                    context: grpc.aio.ServicerContext) -> cpb.SleepResponse:
        async def body() -> cpb.SleepResponse:
            sleep = epb.EngineSleep(level=request.level) if request.HasField("level") \
                else epb.EngineSleep()
            state = await self.flow.control.engine_call(sleep=sleep)
            return cpb.SleepResponse(is_sleeping=state.is_sleeping)
        return await self._traced("Sleep", context, body)

    async def WakeUp(self, request: cpb.WakeUpRequest,
                     context: grpc.aio.ServicerContext) -> cpb.WakeUpResponse:
        async def body() -> cpb.WakeUpResponse:
            state = await self.flow.control.engine_call(wake_up=epb.EngineWakeUp(tags=request.tags))
            return cpb.WakeUpResponse(is_sleeping=state.is_sleeping)
        return await self._traced("WakeUp", context, body)

    async def IsSleeping(self, request: cpb.IsSleepingRequest,
                         context: grpc.aio.ServicerContext) -> cpb.IsSleepingResponse:
        async def body() -> cpb.IsSleepingResponse:
            state = await self.flow.control.engine_call(query=epb.EngineQuery())
            return cpb.IsSleepingResponse(is_sleeping=state.is_sleeping)
        return await self._traced("IsSleeping", context, body)

    async def StartProfile(self, request: cpb.StartProfileRequest,
                           context: grpc.aio.ServicerContext) -> cpb.StartProfileResponse:
        async def body() -> cpb.StartProfileResponse:
            await self.flow.control.engine_call(profile=epb.EngineProfile(start=True))
            return cpb.StartProfileResponse()
        return await self._traced("StartProfile", context, body)

    async def StopProfile(self, request: cpb.StopProfileRequest,
                          context: grpc.aio.ServicerContext) -> cpb.StopProfileResponse:
        async def body() -> cpb.StopProfileResponse:
            state = await self.flow.control.engine_call(profile=epb.EngineProfile(start=False))
            return cpb.StopProfileResponse(trace_path=state.profile_path)
        return await self._traced("StopProfile", context, body)

    async def GetSupportedTasks(self, request: cpb.GetSupportedTasksRequest,
                                context: grpc.aio.ServicerContext
                                ) -> cpb.GetSupportedTasksResponse:
        async def body() -> cpb.GetSupportedTasksResponse:
            state = await self.flow.control.engine_call(query=epb.EngineQuery())
            return cpb.GetSupportedTasksResponse(tasks=state.supported_tasks)
        return await self._traced("GetSupportedTasks", context, body)
