"""deploy/kubernetes: every resource passes kubernetes-validate --strict (the Kubernetes API's
own JSON schemas, from PyPI), and the stack's conventions hold: gRPC health probes, non-root,
read-only root fs, limits, a GPU engine StatefulSet (none in the cpu overlay), an exposed gateway."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
BASE = ROOT / "base"


def _validator() -> str:
    exe = shutil.which("kubernetes-validate")
    if exe is None:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate; "
                    ".ci/run installs it)")
    return exe


def _resource_files() -> list[Path]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return [BASE / name for name in kustomization["resources"]]


def _docs() -> list[dict[str, Any]]:
    return [d for f in _resource_files() for d in yaml.safe_load_all(f.read_text()) if d]


def _by(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def test_every_resource_passes_strict_validation() -> None:
    files = _resource_files()
    assert sorted(p.name for p in files) == sorted(
        p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
    run = subprocess.run([_validator(), "--strict", *map(str, files)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("passed") == len(_docs())


def test_validator_rejects_a_broken_manifest(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = (BASE / "gateway.yaml").read_text().replace("containerPort:", "containerPortt:", 1)
    bad.write_text(text)
    run = subprocess.run([_validator(), "--strict", str(bad)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode != 0


def test_stage_conventions() -> None:
    workloads = [d for d in _docs() if d["kind"] in ("Deployment", "StatefulSet")]
    names = {d["metadata"]["name"]: d["kind"] for d in workloads}
    assert names == {"strand-gateway": "Deployment", "strand-tokenizer": "Deployment",
                     "strand-detokenizer": "Deployment", "strand-openai": "Deployment",
                     "strand-engine": "StatefulSet"}
    services = {d["metadata"]["name"] for d in _docs() if d["kind"] == "Service"}
    assert {f"strand-{n}" for n in ("gateway", "tokenizer", "detokenizer", "openai",
                                    "engine")} <= services
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (c,) = pod["containers"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"cpu", "memory"} <= set(c["resources"]["limits"])
        assert {"configMapRef": {"name": "strand-config"}} in c["envFrom"]
        if w["metadata"]["name"] != "strand-openai":
            port = c["ports"][0]["containerPort"]
            assert c["livenessProbe"]["grpc"] == {"port": port}
            assert c["readinessProbe"]["grpc"] == {"port": port, "service": "readiness"}
    engine = _by("StatefulSet", "strand-engine")["spec"]["template"]["spec"]["containers"][0]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert _by("Service", "strand-gateway")["spec"]["type"] == "LoadBalancer"
    # The gateway drains on SIGTERM: its pod's grace outlasts --shutdown-timeout.
    gateway_pod = _by("Deployment", "strand-gateway")["spec"]["template"]["spec"]
    command = gateway_pod["containers"][0]["command"]
    shutdown_timeout = float(command[command.index("--shutdown-timeout") + 1])
    assert gateway_pod["terminationGracePeriodSeconds"] > shutdown_timeout > 0
    config = _by("ConfigMap", "strand-config")["data"]
    assert config["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].endswith(":4317")


def test_cpu_overlay_drops_the_gpu() -> None:
    overlay = yaml.safe_load((ROOT / "overlays" / "cpu" / "kustomization.yaml").read_text())
    assert (ROOT / "overlays" / "cpu" / overlay["resources"][0]).resolve() == BASE
    (patch,) = overlay["patches"]
    assert patch["target"] == {"kind": "StatefulSet", "name": "strand-engine"}
    (op,) = yaml.safe_load(patch["patch"])
    assert op["path"] == "/spec/template/spec/containers/0/resources"
    assert "nvidia.com/gpu" not in op["value"]["limits"]
    assert "nvidia.com/gpu" not in op["value"]["requests"]
