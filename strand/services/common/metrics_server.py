"""Prometheus /metrics for one service: its own registry (the stage's metrics and the process's
CPU and memory) on an HTTP port of its own, served from a thread so that a scrape never waits
for the event loop or the engine's step.

Always Prometheus' classic text format (0.0.4), never OpenMetrics: prometheus-client 0.26
writes OpenMetrics sample names with ':' turned into '_' (its HELP and TYPE lines keep the ':'),
so a Prometheus that negotiates OpenMetrics would store strand_generation_tokens_total instead
of strand:generation_tokens_total. Every Prometheus reads the text format.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import ThreadingWSGIServer

from strand.services.common.errors import UserError

logger = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape would drown the service's log


def metrics_app(registry: CollectorRegistry) -> Callable[..., Iterable[bytes]]:
    """A WSGI app answering GET /metrics with the registry in the text format."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") not in ("/metrics", "/metrics/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: metrics are at /metrics\n"]
        body = generate_latest(registry)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE),
                                  ("Content-Length", str(len(body)))])
        return [body]

    return app


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
    ProcessCollector(registry=registry)
    try:
        server = make_server(host, port, metrics_app(registry), ThreadingWSGIServer,
                             handler_class=_QuietHandler)
    except OSError as exc:
        raise UserError(f"{name}: cannot serve metrics on {host}:{port} ({exc.strerror}); "
                        f"choose another with --metrics-port") from exc
    thread = threading.Thread(target=server.serve_forever, name=f"{name}-metrics", daemon=True)
    thread.start()
    print(f"strand {name} metrics at http://{host}:{server.server_port}/metrics", flush=True)
    return MetricsServer(server, thread)
