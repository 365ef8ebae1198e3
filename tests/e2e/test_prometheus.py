"""A real Prometheus server (Debian's `prometheus` package) scrapes every service of the stack
and answers queries about them through its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from strand.services.client import EngineClient
from strand.services.launch import METRICS_ORDER, Stack, free_port
from tests.e2e.metrics_scrape import run_requests, scrape, value

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="the prometheus binary is absent (Debian: apt-get install -y "
                               "prometheus)")
WAIT_S = 40.0


def write_config(stack: Stack, path: Path) -> None:
    # JSON is YAML: one target per service, labelled with its name.
    jobs = [{"job_name": "strand", "scrape_interval": "1s", "scrape_timeout": "1s",
             "static_configs": [{"targets": [f"127.0.0.1:{stack.metrics_ports[name]}"],
                                 "labels": {"service": name}} for name in METRICS_ORDER]}]
    path.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}))


@pytest.fixture
def prometheus(stack: Stack, tmp_path: Path) -> Iterator[str]:
    """The base URL of a Prometheus server scraping the shared stack, on a free port."""
    assert PROMETHEUS is not None
    config = tmp_path / "prometheus.yml"
    write_config(stack, config)
    address = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address={address}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://{address}"
    try:
        wait_for(lambda: _get(f"{url}/-/ready") is not None, "Prometheus to be ready", process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        log.close()


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read()  # type: ignore[no-any-return]
    except OSError:
        return None


def query(base: str, promql: str) -> list[dict[str, object]]:
    """The instant vector of a PromQL query ([] when nothing matches yet)."""
    body = _get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    assert body is not None, f"Prometheus did not answer {promql!r}"
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]  # type: ignore[no-any-return]


def wait_for(predicate: object, what: str, process: subprocess.Popen[bytes] | None = None
             ) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():  # type: ignore[operator]
        if process is not None and process.poll() is not None:
            raise AssertionError(f"prometheus exited with {process.returncode}")
        assert time.monotonic() < deadline, f"waited {WAIT_S:.0f}s for {what}"
        time.sleep(0.25)


def scalar(base: str, promql: str) -> float | None:
    result = query(base, promql)
    return float(result[0]["value"][1]) if result else None  # type: ignore[index]


def test_prometheus_scrapes_every_service_and_sees_requests(
        stack: Stack, client: EngineClient, prometheus: str) -> None:
    wait_for(lambda: scalar(prometheus, 'count(up{job="strand"} == 1)') == len(METRICS_ORDER),
             "all four services to be up in Prometheus")
    up = {r["metric"]["service"] for r in query(prometheus, 'up{job="strand"} == 1')}  # type: ignore[index]
    assert up == set(METRICS_ORDER)

    run_requests(client, "prometheus")
    # The stack is idle now: what Prometheus holds must catch up with what the services say.
    engine = scrape(stack, "engine")[1]
    detok = scrape(stack, "detokenizer")[1]
    generated = value(engine, "strand:generation_tokens_total")
    finished = value(detok, "strand:request_success_total", {"finished_reason": "length"})
    wait_for(lambda: scalar(prometheus, 'strand:generation_tokens_total{service="engine"}')
             == generated, "Prometheus to scrape the new generation token count")
    wait_for(lambda: scalar(prometheus, 'sum(strand:request_success_total'
                                        '{service="detokenizer",finished_reason="length"})')
             == finished, "Prometheus to scrape the finished requests")
    count = scalar(prometheus, 'sum(strand:e2e_request_latency_seconds_count'
                               '{service="detokenizer"})')
    assert count is not None and count >= 2
