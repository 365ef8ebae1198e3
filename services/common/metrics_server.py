"""Prometheus /metrics for one service: its own registry (the stage's metrics and the process's
CPU and memory) on an HTTP port of its own, served from a thread so that a scrape never waits
for the event loop or the engine's step."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.registry import REGISTRY

from services.common.errors import UserError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=2.0)


def check_metrics_port(port: int | None) -> None:
    if port is not None and not 0 <= port <= 65535:
        raise ValueError(f"metrics_port must be in [0, 65535] (0: off), got {port}")


def start_metrics_server(name: str, host: str, port: int | None,
                         registry: CollectorRegistry | None) -> MetricsServer | None:
    """Serve `registry` on http://host:port/metrics; None (nothing served) when port is 0 or
    None. The process's own metrics (process_cpu_seconds_total, ...) are added to it."""
    check_metrics_port(port)
    if not port:
        return None
    registry = registry if registry is not None else CollectorRegistry()
    # No `*_created` series beside every counter and histogram (vLLM serves none either).
    disable_created_metrics()
    if registry is not REGISTRY:
        ProcessCollector(registry=registry)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise UserError(f"{name}: cannot serve metrics on {host}:{port} ({exc.strerror}); "
                        f"choose another with --metrics-port") from exc
    print(f"strand {name} metrics at http://{host}:{server.server_port}/metrics", flush=True)
    return MetricsServer(server, thread)
