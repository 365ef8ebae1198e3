"""docker-compose.yml and the CLI cannot drift: each service's compose command runs here as is
(hosts and ports mapped to loopback), and the stack it makes answers requests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from strand.services.launch import REPO_ROOT, free_port, wait_healthy
from strand.services.openai.health import wait_http_healthy

COMPOSE = REPO_ROOT / "docker-compose.yml"
SERVICES = ("tokenizer", "engine", "detokenizer", "gateway")
PORTS = (50051, 50052, 50053, 50054, 8000)
_INTERPOLATION = re.compile(r"\$\{(\w+):-([^}]*)\}")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _localize(arg: str, model_dir: Path, ports: dict[int, int]) -> str:
    arg = _INTERPOLATION.sub(lambda m: str(model_dir) if m.group(1) == "STRAND_MODEL"
                             else m.group(2), arg)
    if arg == "0.0.0.0":
        return "127.0.0.1"
    match = re.fullmatch(r"(\w+):(\d+)", arg)
    if match and match.group(1) in SERVICES:  # a peer by its compose name
        return f"127.0.0.1:{ports[int(match.group(2))]}"
    if arg.isdigit() and int(arg) in ports:
        return str(ports[int(arg)])
    return arg


def _local_command(command: list[str], model_dir: Path, ports: dict[int, int]) -> list[str]:
    assert command[0] == "strand", "compose commands use the console script"
    return [sys.executable, "-m", "strand.services.cli",
            *(_localize(a, model_dir, ports) for a in command[1:])]


def test_compose_has_the_four_services_healthchecks_volume_and_jaeger() -> None:
    compose = _compose()
    services = compose["services"]
    for name in SERVICES:
        assert services[name]["healthcheck"]["test"][:4] == [
            "CMD", "python", "-m", "strand.services.common.healthcheck"]
        assert "models:/models" in services[name]["volumes"]
        assert services[name]["build"]["args"]["BASE_IMAGE"]
    assert "models" in compose["volumes"]
    # Published on the host's loopback only, like the services themselves.
    assert {"127.0.0.1:4317:4317", "127.0.0.1:16686:16686"} <= {
        p.split()[0] for p in services["jaeger"]["ports"]}
    assert "127.0.0.1:50051:50051" in services["gateway"]["ports"]
    # docker stop drains the gateway: its grace outlasts --shutdown-timeout.
    command = services["gateway"]["command"]
    shutdown_timeout = float(command[command.index("--shutdown-timeout") + 1])
    assert float(services["gateway"]["stop_grace_period"].rstrip("s")) > shutdown_timeout > 0
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2")


def test_dockerfile_takes_a_base_image_argument() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim" in text
    assert "FROM ${BASE_IMAGE}" in text


@pytest.fixture(scope="module")
def compose_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[dict[str, int]]:
    services = _compose()["services"]
    ports = {port: free_port() for port in PORTS}
    log_dir = tmp_path_factory.mktemp("compose-logs")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    local_ports = {}
    try:
        for name in SERVICES:
            command = _local_command(services[name]["command"], tiny_model_dir, ports)
            log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
            processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                               env=env, cwd=REPO_ROOT)
            check = services[name]["healthcheck"]["test"]
            local_ports[name] = int(_localize(check[-1].split(":")[1], tiny_model_dir, ports))
        for name in SERVICES:
            wait_healthy(f"127.0.0.1:{local_ports[name]}", 120, processes[name], name)
        # The OpenAI front once the gateway is healthy (compose's depends_on), checked over HTTP.
        command = _local_command(services["openai"]["command"], tiny_model_dir, ports)
        processes["openai"] = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, env=env, cwd=REPO_ROOT)
        local_ports["openai"] = ports[8000]
        wait_http_healthy(f"http://127.0.0.1:{ports[8000]}/health", 60, processes["openai"])
        yield local_ports
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


def test_compose_healthcheck_commands_pass(compose_stack: dict[str, int]) -> None:
    services = _compose()["services"]
    for name in (*SERVICES, "openai"):
        check = services[name]["healthcheck"]["test"][1:]
        target = check[-1].replace(check[-1].rsplit(":", 1)[-1].split("/")[0],
                                   str(compose_stack[name]))
        result = subprocess.run([sys.executable, *check[1:-1], target], cwd=REPO_ROOT,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=30)
        assert result.returncode == 0, name


def test_compose_openai_front_answers_a_completion(compose_stack: dict[str, int]) -> None:
    body = json.dumps({"prompt": [1, 42, 7], "max_tokens": 3, "temperature": 0.0,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{compose_stack['openai']}/v1/completions",
                                     data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        answer = json.loads(resp.read())
    assert answer["usage"]["completion_tokens"] == 3


def test_compose_commands_make_a_working_stack(compose_stack: dict[str, int]) -> None:
    with EngineClient(f"127.0.0.1:{compose_stack['gateway']}", timeout=60) as client:
        outputs = list(client.generate("compose", SamplingParams(temperature=0.0, max_tokens=3)))
    assert outputs[-1].finished
    assert len(outputs[-1].outputs[0].token_ids) == 3


SMG_PROFILE = {"vllm-grpc", "smg"}


def test_the_smg_profile_alone_adds_the_vllm_grpc_front_and_smg() -> None:
    services = _compose()["services"]
    assert {name for name, s in services.items() if "profiles" in s} == SMG_PROFILE
    assert all(services[name]["profiles"] == ["smg"] for name in SMG_PROFILE)
    front, smg = services["vllm-grpc"], services["smg"]
    assert front["command"][:3] == ["python", "-m", "strand.services.vllm_grpc"]
    port = front["command"][front["command"].index("--port") + 1]
    assert front["command"][front["command"].index("--gateway-addr") + 1] == "gateway:50051"
    assert front["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert front["healthcheck"]["test"][-1] == f"127.0.0.1:{port}"
    assert front["depends_on"] == {"gateway": {"condition": "service_healthy"}}
    # smg: the same Dockerfile with smg added, routing to the front, published on loopback.
    assert smg["build"]["args"]["EXTRA_PACKAGES"].startswith("smg")
    assert smg["command"][:2] == ["smg", "launch"]
    assert smg["command"][smg["command"].index("--worker-urls") + 1] == f"grpc://vllm-grpc:{port}"
    smg_port = smg["command"][smg["command"].index("--port") + 1]
    assert smg["ports"] == [f"127.0.0.1:{smg_port}:{smg_port}"]
    assert smg["depends_on"] == {"vllm-grpc": {"condition": "service_healthy"}}
    assert smg["healthcheck"]["test"][-1] == f"http://127.0.0.1:{smg_port}/readiness"
    assert 'ARG EXTRA_PACKAGES=""' in (REPO_ROOT / "Dockerfile").read_text()


def _local_profile_command(command: list[str], model_dir: Path, peers: dict[str, str],
                           ports: dict[int, int]) -> list[str]:
    """A profile service's command on loopback: peers maps "name:port" to a local address."""
    local = []
    for arg in command:
        for peer, address in peers.items():
            arg = arg.replace(peer, address)
        local.append(_localize(arg, model_dir, ports))
    return [sys.executable if local[0] == "python" else local[0], *local[1:]]


def test_compose_smg_profile_commands_serve_a_completion(
        compose_stack: dict[str, int], tiny_model_dir: Path, tmp_path: Path) -> None:
    if shutil.which("smg") is None:
        pytest.skip("smg is not installed (pip install smg)")
    services = _compose()["services"]
    ports = {50061: free_port(), 30000: free_port()}
    peers = {"gateway:50051": f"127.0.0.1:{compose_stack['gateway']}",
             "vllm-grpc:50061": f"127.0.0.1:{ports[50061]}"}
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    processes = []
    try:
        for name in ("vllm-grpc", "smg"):
            command = _local_profile_command(services[name]["command"], tiny_model_dir, peers,
                                             ports)
            if name == "smg":  # not its default metrics port 29000, which may be taken here
                command += ["--prometheus-host", "127.0.0.1", "--prometheus-port",
                            str(free_port())]
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                              env=env, cwd=REPO_ROOT))
            if name == "vllm-grpc":
                wait_healthy(f"127.0.0.1:{ports[50061]}", 60, processes[-1], name)
        # The compose healthcheck's /readiness: 200 once smg has a healthy worker.
        check = services["smg"]["healthcheck"]["test"][-1]
        wait_http_healthy(check.replace("30000", str(ports[30000])), 120, processes[-1])
        body = json.dumps({"model": str(tiny_model_dir), "prompt": "Hello", "max_tokens": 3,
                           "temperature": 0.0, "ignore_eos": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{ports[30000]}/v1/completions",
                                         data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer = json.loads(resp.read())
        assert answer["usage"]["completion_tokens"] == 3
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
