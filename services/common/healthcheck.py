"""`python -m services.common.healthcheck HOST:PORT`: exit 0 when the server reports SERVING.

Used by compose healthchecks (no grpcurl or grpc_health_probe needed in the image).
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def is_serving(address: str, timeout: float = 3.0) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                             timeout=timeout)
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m services.common.healthcheck HOST:PORT", file=sys.stderr)
        return 2
    return 0 if is_serving(args[0]) else 1


if __name__ == "__main__":
    sys.exit(main())
