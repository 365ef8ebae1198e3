"""Strand's gRPC services. Importing the package applies STRAND_GRPC_IOMGR=1 (gRPC's older TCP
path, one thread wake-up fewer per message) before anything imports grpc: strand/services/grpc_tuning.py
says what it measured and why it is not the default."""

from strand.services import grpc_tuning

grpc_tuning.apply()
