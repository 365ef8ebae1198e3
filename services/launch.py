"""Start the whole stack as local processes on loopback (the embedded default of `strand serve`).

Each stage is `python -m services.<name>` with its peers' addresses; the stack is up when every
stage answers its health check.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

STAGES = ("tokenizer", "engine", "detokenizer")
SERVICES = (*STAGES, "gateway")
REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_healthy(address: str, timeout: float, process: subprocess.Popen[bytes] | None = None,
                 name: str = "service", root_certificates: bytes | None = None) -> None:
    """Block until `address` answers SERVING; RuntimeError if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    channel = (grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates))
               if root_certificates is not None else grpc.insecure_channel(address))
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"{name} exited with code {process.returncode} before it "
                                   f"was healthy")
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} at {address} not healthy after {timeout:.0f}s")
            time.sleep(0.1)


@dataclass(slots=True)
class StackConfig:
    model: str
    engine_args: list[str] = field(default_factory=list)  # EngineArgs flags for the stages
    gateway_args: list[str] = field(default_factory=list)  # --auto-step, --api-key, ...
    host: str = "127.0.0.1"
    gateway_port: int = 0  # 0: a free port
    otlp_traces_endpoint: str | None = None
    log_dir: Path | None = None  # None: the stages write to this process's stdout/stderr
    tls_cert: str | None = None  # the gateway's certificate and key (PEM files): TLS to clients
    tls_key: str | None = None


@dataclass(slots=True)
class Stack:
    config: StackConfig
    ports: dict[str, int]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def address(self, name: str) -> str:
        return f"{self.config.host}:{self.ports[name]}"

    @property
    def gateway_address(self) -> str:
        return self.address("gateway")

    def command(self, name: str) -> list[str]:
        cfg = self.config
        cmd = [sys.executable, "-m", f"services.{name}", "--host", cfg.host,
               "--port", str(self.ports[name])]
        if cfg.otlp_traces_endpoint:
            cmd += ["--otlp-traces-endpoint", cfg.otlp_traces_endpoint]
        if name == "gateway":
            cmd += [f"--{s}-addr={self.address(s)}" for s in STAGES] + cfg.gateway_args
            if cfg.tls_cert and cfg.tls_key:
                cmd += ["--tls-cert", cfg.tls_cert, "--tls-key", cfg.tls_key]
        else:
            cmd += ["--model", cfg.model, *cfg.engine_args]
        return cmd

    def start(self, name: str, timeout: float = 120.0) -> None:
        """(Re)start one service and wait for its health."""
        self.start_async(name)
        roots = None
        if name == "gateway" and self.config.tls_cert:
            roots = Path(self.config.tls_cert).read_bytes()
        wait_healthy(self.address(name), timeout, self.processes[name], name, roots)

    def start_async(self, name: str) -> None:
        log_dir = self.config.log_dir
        out: int | object = subprocess.DEVNULL if log_dir else None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            out = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # The stages import `services` from this checkout whether or not it is installed.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self.processes[name] = subprocess.Popen(self.command(name), stdout=out,  # type: ignore[arg-type]
                                                stderr=subprocess.STDOUT if log_dir else None,
                                                env=env)

    def kill(self, name: str) -> None:
        """SIGKILL one service (fault tests): no chance to clean up, as in a crash."""
        process = self.processes[name]
        process.kill()
        process.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every service (gateway first), then SIGKILL what is still running."""
        order = ["gateway", *STAGES]
        for name in order:
            process = self.processes.get(name)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name in order:
            process = self.processes.get(name)
            if process is None:
                continue
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_stack(config: StackConfig, timeout: float = 180.0) -> Stack:
    """Start the four services (stages in parallel, then the gateway) and wait for health."""
    ports = {name: free_port(config.host) for name in STAGES}
    ports["gateway"] = config.gateway_port or free_port(config.host)
    stack = Stack(config, ports)
    try:
        for name in STAGES:
            stack.start_async(name)
        for name in STAGES:
            wait_healthy(stack.address(name), timeout, stack.processes[name], name)
        stack.start("gateway", timeout)
    except BaseException:
        stack.stop()
        raise
    return stack

