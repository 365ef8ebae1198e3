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
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strand.platform.ports import free_ports
from strand.services.common.errors import UserError
from strand.services.common.server import READINESS
from strand.services.common.stage_auth import STAGE_TOKEN_ENV, new_stage_token, stage_token
from strand.services.common.stage_link import transport

STAGES = ("tokenizer", "engine", "detokenizer")
# Readiness order: each stage is ready once the stages it sends to are.
_READY_ORDER = ("engine", "detokenizer", "tokenizer")
SERVICES = (*STAGES, "gateway")
# --metrics-port P: the gateway serves /metrics on P, the stages on the ports after it.
METRICS_ORDER = ("gateway", *STAGES)
REPO_ROOT = Path(__file__).resolve().parents[2]


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while interrupt_on_signals was in force."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


# While a child is being spawned a signal is held back (raised right after): an exception in
# the middle of Popen would leave a started child that nobody tracks.
_spawning = False
_held_signal: int | None = None
# The last signal raised as Interrupted, until a wait checks it: Python drops an exception
# raised inside a callback whose errors it ignores (an import lock's weakref callback, seen in
# CI: "Exception ignored in: <function _get_module_lock.<locals>.cb>"), and serve then started
# as if no signal had come. The waits raise it again (check_interrupted).
_raised_signal: int | None = None


def _raise_interrupted(signum: int, frame: object) -> None:
    global _held_signal, _raised_signal
    if _spawning:
        _held_signal = signum
        return
    _raised_signal = signum
    raise Interrupted(signum)


def check_interrupted() -> None:
    """Interrupted for a signal whose exception was raised and lost (see _raised_signal)."""
    global _raised_signal
    signum, _raised_signal = _raised_signal, None
    if signum is not None:
        raise Interrupted(signum)


@contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """SIGINT/SIGTERM raise Interrupted in the main thread from here on, so a `finally` that
    stops the stack runs whenever they come (before launch, during start-up, or later)."""
    global _raised_signal
    _raised_signal = None
    previous = {sig: signal.signal(sig, _raise_interrupted)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """While the stack stops: a second Ctrl-C must not cut the stop short and orphan children."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_port_free(host: str, port: int, flag: str = "--port") -> None:
    """UserError naming the port and the flag when something already listens on host:port."""
    if port == 0:
        return
    with socket.socket() as sock:
        # SO_REUSEADDR as the gRPC server sets it: only a listening socket is a conflict.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UserError(f"port {port} on {host} is in use ({exc.strerror}); "
                            f"choose another with {flag}") from exc


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(host, 1)[0]


def wait_healthy(address: str, timeout: float, process: subprocess.Popen[bytes] | None = None,
                 name: str = "service", root_certificates: bytes | None = None,
                 service: str = READINESS) -> None:
    """Block until `address` answers SERVING for `service` (readiness: its part of the ring is
    connected; "" or "liveness": the process is up); RuntimeError if the process exits or time
    runs out."""
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
                resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} at {address} not healthy after {timeout:.0f}s")
            check_interrupted()
            time.sleep(0.1)


@dataclass(slots=True)
class StackConfig:
    model: str
    engine_args: list[str] = field(default_factory=list)  # EngineArgs flags for the stages
    gateway_args: list[str] = field(default_factory=list)  # --auto-step, --api-key, ...
    engine_stage_args: list[str] = field(default_factory=list)  # the engine's own: --add-hold-ms
    host: str = "127.0.0.1"
    gateway_port: int = 0  # 0: a free port
    otlp_traces_endpoint: str | None = None
    log_dir: Path | None = None  # None: the stages write to this process's stdout/stderr
    tls_cert: str | None = None  # the gateway's certificate and key (PEM files): TLS to clients
    tls_key: str | None = None
    openai_port: int | None = None  # the OpenAI-compatible front's port (0: a free one); None: none
    # Prometheus /metrics: None off; 0 a free port per service; P the gateway on P and the
    # tokenizer, engine and detokenizer on P+1, P+2, P+3 (METRICS_ORDER).
    metrics_port: int | None = None
    data_parallel_size: int = 1  # engine replicas started here (each its own process)
    engine_addresses: list[str] = field(default_factory=list)  # engines started elsewhere
    router_policy: str | None = None  # the tokenizer's; None: kv-aware with several engines
    # On a stop, seconds the gateway's requests in flight get to finish (its --shutdown-timeout).
    shutdown_timeout: float = 0.0

    def __post_init__(self) -> None:
        if self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {self.data_parallel_size}")
        if self.engine_addresses and self.data_parallel_size != 1:
            raise ValueError("data_parallel_size must be 1 with engine_addresses (the engines "
                             "are started elsewhere), got "
                             f"{self.data_parallel_size}")

    @property
    def engine_names(self) -> list[str]:
        """The engine processes this stack starts: "engine", or engine-0 ... engine-{N-1}."""
        if self.engine_addresses:
            return []
        if self.data_parallel_size == 1:
            return ["engine"]
        return [f"engine-{i}" for i in range(self.data_parallel_size)]

    @property
    def routes_kv_aware(self) -> bool:
        num_engines = len(self.engine_addresses) or self.data_parallel_size
        return num_engines > 1 and self.router_policy in (None, "kv-aware")
    openai_args: list[str] = field(default_factory=list)  # more flags for it (--lora-modules)
    # vLLM's gRPC engine protocol (strand/services/vllm_grpc, for smg): its port (0: a free
    # one); None: none
    vllm_grpc_port: int | None = None


@dataclass(slots=True)
class Stack:
    config: StackConfig
    ports: dict[str, int]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Every service of the stack shares it: the stages accept only callers that send it.
    stage_token: str = field(default_factory=lambda: stage_token() or new_stage_token())
    metrics_ports: dict[str, int] = field(default_factory=dict)  # service -> its /metrics port

    def address(self, name: str) -> str:
        return f"{self.config.host}:{self.ports[name]}"

    @property
    def stage_names(self) -> list[str]:
        """Every stage process, engines in the middle (readiness order is _READY_ORDER)."""
        return ["tokenizer", *self.config.engine_names, "detokenizer"]

    @property
    def engine_addrs(self) -> str:
        """What the other stages are given as --engine-addr: every replica, comma-separated."""
        if self.config.engine_addresses:
            return ",".join(self.config.engine_addresses)
        return ",".join(self.address(n) for n in self.config.engine_names)

    @property
    def gateway_address(self) -> str:
        return self.address("gateway")

    def command(self, name: str) -> list[str]:
        cfg = self.config
        module = "engine" if name in cfg.engine_names else name
        if name == "vllm_grpc":
            return [sys.executable, "-m", "strand.services.vllm_grpc", "--host", cfg.host,
                    "--port", str(self.ports[name]), *_vllm_grpc_args(self)]
        cmd = [sys.executable, "-m", f"strand.services.{module}", "--host", cfg.host,
               "--port", str(self.ports[name])]
        if cfg.otlp_traces_endpoint:
            cmd += ["--otlp-traces-endpoint", cfg.otlp_traces_endpoint]
        if name in self.metrics_ports:
            cmd += ["--metrics-port", str(self.metrics_ports[name])]
        if name == "openai":
            return cmd + _openai_args(self)
        if name == "gateway":
            cmd += [f"--tokenizer-addr={self.address('tokenizer')}",
                    f"--engine-addr={self.engine_addrs}",
                    f"--detokenizer-addr={self.address('detokenizer')}", *cfg.gateway_args]
            if cfg.shutdown_timeout:
                cmd += ["--shutdown-timeout", str(cfg.shutdown_timeout)]
            if cfg.tls_cert and cfg.tls_key:
                cmd += ["--tls-cert", cfg.tls_cert, "--tls-key", cfg.tls_key]
            return cmd
        cmd += ["--model", cfg.model, *cfg.engine_args]
        # The ring: each stage is told the next ones; the engine's mode is the stack's.
        if name == "tokenizer":
            cmd += [f"--engine-addr={self.engine_addrs}",
                    f"--detokenizer-addr={self.address('detokenizer')}"]
            if cfg.router_policy:
                cmd += ["--router-policy", cfg.router_policy]
            return cmd
        if name == "detokenizer":
            return cmd + [f"--engine-addr={self.engine_addrs}"]
        if "--auto-step" in cfg.gateway_args:
            cmd += ["--auto-step"]
        cmd += cfg.engine_stage_args
        if cfg.routes_kv_aware and "--kv-events" not in cmd:
            cmd += ["--kv-events"]  # the router's index is fed by them
        return cmd

    def replica_env(self, name: str, env: dict[str, str]) -> dict[str, str]:
        """Engine replica i gets the i-th of CUDA_VISIBLE_DEVICES when it names one device per
        replica (its own GPU); otherwise the replicas share what is visible."""
        names = self.config.engine_names
        devices = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        if name not in names or len(names) < 2 or len(devices) < len(names):
            return {}
        return {"CUDA_VISIBLE_DEVICES": devices[names.index(name)].strip()}

    def start(self, name: str, timeout: float = 120.0) -> None:
        """(Re)start one service and wait for its health."""
        self.start_async(name)
        roots = None
        if name in ("gateway", "vllm_grpc") and self.config.tls_cert:
            roots = Path(self.config.tls_cert).read_bytes()
        self.wait_service(name, timeout, roots)

    def wait_service(self, name: str, timeout: float, root_certificates: bytes | None = None
                     ) -> None:
        """wait_healthy for one started service; a service that exits or never becomes healthy
        raises with the end of its log (with a log_dir), the line that says why."""
        try:
            wait_healthy(self.address(name), timeout, self.processes[name], name,
                         root_certificates)
        except RuntimeError as exc:
            tail = self.log_tail(name)
            if not tail:
                raise
            raise RuntimeError(f"{exc}; the end of its log:\n{tail}") from exc

    def log_tail(self, name: str, lines: int = 8) -> str:
        """The last lines of a service's log file ("" without a log_dir or a log)."""
        if self.config.log_dir is None:
            return ""
        try:
            text = (self.config.log_dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def start_async(self, name: str) -> None:
        log_dir = self.config.log_dir
        out: int | object = subprocess.DEVNULL if log_dir else None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            out = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[STAGE_TOKEN_ENV] = self.stage_token
        env.update(self.replica_env(name, env))
        # The stages import `services` from this checkout whether or not it is installed.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        global _spawning, _held_signal
        _spawning = True
        try:
            # Own session: a terminal's Ctrl-C reaches only the launcher, which stops each
            # service in order (instead of four half-started services each printing a trace).
            self.processes[name] = subprocess.Popen(
                self.command(name), stdout=out,  # type: ignore[arg-type]
                stderr=subprocess.STDOUT if log_dir else None, env=env, start_new_session=True)
        finally:
            _spawning = False
        held, _held_signal = _held_signal, None
        if held is not None:
            raise Interrupted(held)

    def kill(self, name: str) -> None:
        """SIGKILL one service (fault tests): no chance to clean up, as in a crash."""
        process = self.processes[name]
        process.kill()
        process.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the services front to back, each wave gone before the next is signalled;
        SIGKILL what is still running at the deadline."""
        if threading.current_thread() is threading.main_thread():
            with signals_ignored():
                self._stop(timeout)
        else:
            self._stop(timeout)

    def stop_waves(self) -> list[list[str]]:
        """The order of a stop: the fronts, then the tokenizer, then the engines and the
        detokenizer. A service that watches the ones behind it is gone before they stop: signalled
        together, the gateway often saw the engine go before it handled its own SIGTERM, and
        warned that the engine was out of rotation."""
        return [["openai", "vllm_grpc"], ["gateway"], ["tokenizer"], [*self.config.engine_names, "detokenizer"]]

    def _stop(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout + self.config.shutdown_timeout
        # The gateway is told first, and once: it drains (readiness NOT_SERVING at once, new
        # requests refused, those in flight, the fronts' too, let finish) while the fronts drain
        # theirs alike (a 503 to new ones) and exit within shutdown_timeout and a few seconds.
        gateway = self.processes.get("gateway")
        if gateway is not None and gateway.poll() is None:
            gateway.send_signal(signal.SIGTERM)
        else:
            gateway = None
        for wave in self.stop_waves():
            running = [p for p in (self.processes.get(n) for n in wave)
                       if p is not None and (p is gateway or p.poll() is None)]
            for process in running:
                if process is not gateway:
                    process.send_signal(signal.SIGTERM)
            for process in running:
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
    """Start the services (stages and engine replicas in parallel, then the gateway) and wait
    for health."""
    transport()  # a bad STRAND_STAGE_TRANSPORT: one ValueError here, not a failing stage each
    names = ["tokenizer", *config.engine_names, "detokenizer"]
    # Chosen together: distinct, and out of the way of the stages' own connections (ports.py).
    *stage_ports, gateway_port = free_ports(config.host, len(names) + 1)
    ports = dict(zip(names, stage_ports, strict=True))
    ports["gateway"] = config.gateway_port or gateway_port
    stack = Stack(config, ports)
    stack.metrics_ports = metrics_ports(
        config.host, config.metrics_port,
        ["gateway", "tokenizer", *config.engine_names, "detokenizer"])
    try:
        for name in names:
            stack.start_async(name)
        for stage in _READY_ORDER:
            for name in config.engine_names if stage == "engine" else [stage]:
                stack.wait_service(name, timeout)
        stack.start("gateway", timeout)
        if config.openai_port is not None:
            from strand.services.openai.health import wait_http_healthy

            stack.ports["openai"] = config.openai_port or free_port(config.host)
            stack.start_async("openai")
            wait_http_healthy(f"http://{stack.address('openai')}/health", timeout,
                              stack.processes["openai"])
        if config.vllm_grpc_port is not None:
            stack.ports["vllm_grpc"] = config.vllm_grpc_port or free_port(config.host)
            stack.start("vllm_grpc", timeout)
    except BaseException:
        stack.stop()
        raise
    return stack


def metrics_ports(host: str, first: int | None,
                  names: Sequence[str] = METRICS_ORDER) -> dict[str, int]:
    """Each service's /metrics port (see StackConfig.metrics_port); names in port order (with
    data-parallel replicas: gateway, tokenizer, engine-0 ... engine-{N-1}, detokenizer)."""
    if first is None:
        return {}
    if first == 0:
        return dict(zip(names, free_ports(host, len(names)), strict=True))
    if not 0 < first <= 65535 - len(names) + 1:
        raise ValueError(f"metrics_port must be in [1, {65535 - len(names) + 1}] "
                         f"({len(names)} ports from it), got {first}")
    return {name: first + i for i, name in enumerate(names)}


def _openai_args(stack: Stack) -> list[str]:
    """The front reaches the gateway as a client does: its address, API key and TLS roots."""
    cfg = stack.config
    args = ["--gateway-addr", stack.gateway_address]
    if "--api-key" in cfg.gateway_args:
        args += ["--api-key", cfg.gateway_args[cfg.gateway_args.index("--api-key") + 1]]
    if cfg.tls_cert:
        args += ["--gateway-tls-cert", cfg.tls_cert]
    if cfg.shutdown_timeout:
        args += ["--shutdown-timeout", str(cfg.shutdown_timeout)]
    return args + cfg.openai_args


def _vllm_grpc_args(stack: Stack) -> list[str]:
    """The vLLM-protocol front: the gateway's address, the model directory (its tokenizer
    bundle), and the gateway's key and TLS, which its own clients must use too."""
    cfg = stack.config
    args = ["--gateway-addr", stack.gateway_address, "--model", cfg.model]
    if cfg.otlp_traces_endpoint:
        args += ["--otlp-traces-endpoint", cfg.otlp_traces_endpoint]
    if "--api-key" in cfg.gateway_args:
        args += ["--api-key", cfg.gateway_args[cfg.gateway_args.index("--api-key") + 1]]
    if cfg.tls_cert and cfg.tls_key:
        args += ["--tls-cert", cfg.tls_cert, "--tls-key", cfg.tls_key,
                 "--gateway-tls-cert", cfg.tls_cert]
    return args
