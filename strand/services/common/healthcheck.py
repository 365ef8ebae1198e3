"""`python -m strand.services.common.healthcheck [--readiness] HOST:PORT`: exit 0 when the server
reports SERVING (liveness: the process answers; --readiness: its part of the ring is connected).

Used by compose healthchecks (no grpcurl or grpc_health_probe needed in the image).
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def is_serving(address: str, timeout: float = 3.0, service: str = "") -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    service = ""
    if args[:1] == ["--readiness"]:
        service = "readiness"
        args = args[1:]
    if len(args) != 1:
        print("usage: python -m strand.services.common.healthcheck [--readiness] HOST:PORT",
              file=sys.stderr)
        return 2
    return 0 if is_serving(args[0], service=service) else 1


if __name__ == "__main__":
    sys.exit(main())
