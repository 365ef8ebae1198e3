"""Every server answers grpc.health.v1 and server reflection (what grpcurl relies on)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from strand.services.launch import SERVICES, Stack

EXPECTED = {"gateway": "strand.v1.Gateway", "tokenizer": "strand.v1.Tokenizer",
            "engine": "strand.v1.Engine", "detokenizer": "strand.v1.Detokenizer"}


@pytest.mark.parametrize("name", SERVICES)
def test_service_reports_serving(stack: Stack, name: str) -> None:
    with grpc.insecure_channel(stack.address(name)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", EXPECTED[name]):
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("name", SERVICES)
def test_reflection_lists_and_describes_the_service(stack: Stack, name: str) -> None:
    with grpc.insecure_channel(stack.address(name)) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = database.get_services()
        assert EXPECTED[name] in services
        assert "grpc.health.v1.Health" in services
        pool = DescriptorPool(database)
        described = pool.FindServiceByName(EXPECTED[name])
        assert len(described.methods) >= 1
