"""What the vLLM-protocol front holds of the Strand stack behind it: one AsyncEngineClient for
requests (so they go through the gateway, its traces and metrics, like any other client's) and a
Control stub on its own channel for the engine-wide calls."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from strand.services._proto.strand.v1 import control_pb2_grpc
from strand.services.async_client import AsyncEngineClient
from strand.services.client import auth_metadata, make_channel


@dataclass(slots=True)
class LinkConfig:
    gateway: str  # host:port of the Strand gateway
    model_dir: Path | None = None  # the model's directory: GetTokenizer's bundle, GetModelInfo
    api_key: str | None = None  # the gateway's (and this front's) key
    root_certificates: bytes | None = None  # the gateway's TLS roots
    served_model_name: str = ""  # GetModelInfo's served_model_name ("" : the gateway's model)
    client_id: str = field(default_factory=lambda: f"vllm-grpc-{uuid.uuid4().hex}")


class GatewayLink:
    """Made inside the event loop that uses it (grpc.aio channels belong to their loop)."""

    def __init__(self, config: LinkConfig) -> None:
        self.config = config
        # One identity for every call: Abort by the caller's ids finds requests this front added.
        self.client = AsyncEngineClient(config.gateway, api_key=config.api_key,
                                        root_certificates=config.root_certificates,
                                        timeout=30.0, client_id=config.client_id)
        self._channel = make_channel(grpc.aio, config.gateway, config.root_certificates)
        self.control = control_pb2_grpc.ControlStub(self._channel)
        self.metadata = auth_metadata(config.api_key, config.client_id)

    async def control_call(self, method: str, request: Any, timeout: float | None = 30.0) -> Any:
        return await getattr(self.control, method)(request, metadata=self.metadata,
                                                   timeout=timeout)

    def kv_stream(self, request: Any) -> Any:
        return self.control.SubscribeKvEvents(request, metadata=self.metadata)

    async def close(self) -> None:
        await self.client.close()
        await self._channel.close()
