"""The stages' gRPC TCP path (strand/services/grpc_tuning.py): gRPC's default, iomgr where asked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from strand.services import grpc_tuning

# A process that imports `strand.services` first, as every `python -m strand.services.X` does, then connects a
# grpc.aio channel to a grpc.aio server; GRPC_TRACE=tcp names the source file of each TCP event:
# iomgr's tcp_posix.cc, or the EventEngine's endpoint.cc.
_CONNECT = """
import asyncio, strand.services, grpc
async def main():
    server = grpc.aio.server(); port = server.add_insecure_port("127.0.0.1:0"); await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.channel_ready()
    await server.stop(0)
asyncio.run(main())
"""


def _tcp_trace(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items()
             if k not in (grpc_tuning.ENV, grpc_tuning.OPT_IN_ENV)}
    proc = subprocess.run([sys.executable, "-c", _CONNECT], capture_output=True, text=True,
                          timeout=60, check=True,
                          env={**clean, "GRPC_VERBOSITY": "debug", "GRPC_TRACE": "tcp", **env})
    return proc.stderr


def test_a_measured_grpcio_gets_the_iomgr_tcp_path_when_asked() -> None:
    environ = {"STRAND_GRPC_IOMGR": "1"}
    assert grpc_tuning.apply(environ, minor=(1, 85)) is True
    assert environ["GRPC_EXPERIMENTS"] == grpc_tuning.IOMGR_TCP


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_asking_grpcs_default_is_kept(value: str | None) -> None:
    environ = {} if value is None else {"STRAND_GRPC_IOMGR": value}
    assert grpc_tuning.apply(environ, minor=(1, 85)) is False
    assert "GRPC_EXPERIMENTS" not in environ


def test_the_users_own_experiments_are_kept() -> None:
    environ = {"GRPC_EXPERIMENTS": "tcp_rcv_lowat", "STRAND_GRPC_IOMGR": "1"}
    assert grpc_tuning.apply(environ, minor=(1, 85)) is False
    assert environ["GRPC_EXPERIMENTS"] == "tcp_rcv_lowat"


def test_an_unmeasured_grpcio_release_is_left_alone() -> None:
    environ = {"STRAND_GRPC_IOMGR": "1"}
    assert grpc_tuning.apply(environ, minor=(1, 99)) is False
    assert "GRPC_EXPERIMENTS" not in environ


def test_the_installed_grpcio_is_read_without_importing_it() -> None:
    minor = grpc_tuning.grpcio_minor()
    assert minor is not None and minor >= (1, 85)


def test_a_process_that_asks_runs_grpc_on_iomgr() -> None:
    if grpc_tuning.grpcio_minor() not in grpc_tuning.MEASURED_MINORS:
        pytest.skip("this grpcio release was not measured: nothing is set on it")
    trace = _tcp_trace(STRAND_GRPC_IOMGR="1")
    assert " tcp_posix.cc:" in trace and " endpoint.cc:" not in trace


def test_a_process_that_imports_services_keeps_grpcs_event_engine() -> None:
    trace = _tcp_trace()
    assert " endpoint.cc:" in trace and " tcp_posix.cc:" not in trace
