"""Strand's gRPC services. Importing the package puts gRPC on its lower-latency TCP path before
anything imports grpc (services/grpc_tuning.py says why, and how to keep gRPC's default)."""

from services import grpc_tuning

grpc_tuning.apply()
