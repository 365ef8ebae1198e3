"""--metrics-port: off unless given, bound on --host, the classic text format whatever the
scraper asks for, one clear error for a port in use; `strand serve` gives each service its
port."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from strand.services.common.errors import UserError
from strand.services.common.metrics_server import MetricsServer, start_metrics_server
from strand.services.common.stage_args import make_parser, parse_stage_args
from strand.services.launch import METRICS_ORDER, Stack, StackConfig, free_port, metrics_ports


@pytest.fixture
def served() -> Iterator[tuple[MetricsServer, Counter]]:
    registry = CollectorRegistry()
    counter = Counter("strand:things", "Things.", ["kind"], registry=registry)
    counter.labels(kind="a").inc(3)
    server = start_metrics_server("test", "127.0.0.1", free_port(), registry)
    assert server is not None
    yield server, counter
    server.stop()


def get(port: int, path: str = "/metrics", accept: str | None = None) -> tuple[str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.headers["Content-Type"], resp.read().decode()


@pytest.mark.parametrize("accept", [None, "application/openmetrics-text;version=1.0.0,"
                                          "text/plain;version=0.0.4;q=0.5"])
def test_metrics_are_text_format_with_colon_names_whatever_is_accepted(
        served: tuple[MetricsServer, Counter], accept: str | None) -> None:
    server, counter = served
    content_type, text = get(server.port, accept=accept)
    assert content_type.startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(s.labels.items())): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("strand:things_total", (("kind", "a"),))] == 3
    assert not any(name.endswith("_created") for name, _ in samples)
    assert ("process_cpu_seconds_total", ()) in samples  # the process's own, added
    counter.labels(kind="a").inc()
    _, text = get(server.port)
    assert "strand:things_total{kind=\"a\"} 4.0" in text


def test_other_paths_are_not_found(served: tuple[MetricsServer, Counter]) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        get(served[0].port, "/")
    assert err.value.code == 404


@pytest.mark.parametrize("port", [None, 0])
def test_no_port_serves_nothing(port: int | None) -> None:
    assert start_metrics_server("test", "127.0.0.1", port, CollectorRegistry()) is None


def test_port_in_use_is_one_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match="--metrics-port"):
            start_metrics_server("engine", "127.0.0.1", port, CollectorRegistry())


def test_stage_flag_is_off_by_default_and_checked() -> None:
    _, options = parse_stage_args(make_parser("engine"), [])
    assert options.metrics_port is None
    _, options = parse_stage_args(make_parser("gateway", engine_flags=False),
                                  ["--metrics-port", "9400"])
    assert options.metrics_port == 9400
    with pytest.raises(SystemExit):
        parse_stage_args(make_parser("engine"), ["--metrics-port", "70000"])


def test_serve_gives_each_service_its_port() -> None:
    assert metrics_ports("127.0.0.1", None) == {}
    assert metrics_ports("127.0.0.1", 9400) == {"gateway": 9400, "tokenizer": 9401,
                                                "engine": 9402, "detokenizer": 9403}
    free = metrics_ports("127.0.0.1", 0)
    assert set(free) == set(METRICS_ORDER) and len(set(free.values())) == 4
    with pytest.raises(ValueError, match="metrics_port"):
        metrics_ports("127.0.0.1", 65534)
    stack = Stack(StackConfig(model="m", metrics_port=9400), ports={
        "gateway": 1, "tokenizer": 2, "engine": 3, "detokenizer": 4},
        metrics_ports=metrics_ports("127.0.0.1", 9400))
    for name, port in stack.metrics_ports.items():
        command = stack.command(name)
        assert command[command.index("--metrics-port") + 1] == str(port)
