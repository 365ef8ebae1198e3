"""The gateway serves TLS when given a certificate and key (a gateway alone, on the shared stages)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from strand.services.launch import Stack
from tests.e2e.conftest import start_side_gateway


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def tls_gateway(stack: Stack, certificate: tuple[Path, Path]) -> Iterator[str]:
    cert, key = certificate
    process, address = start_side_gateway(stack, ["--tls-cert", str(cert), "--tls-key", str(key)],
                                          cert.read_bytes())
    try:
        yield address
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_generate_over_tls(tls_gateway: str, certificate: tuple[Path, Path]) -> None:
    with EngineClient(tls_gateway, root_certificates=certificate[0].read_bytes(),
                      timeout=60) as client:
        outputs = list(client.generate("secure", SamplingParams(temperature=0.0, max_tokens=2)))
        assert outputs[-1].finished
        assert client.get_num_unfinished_requests() == 0


def test_plaintext_client_cannot_talk_to_a_tls_gateway(tls_gateway: str) -> None:
    with EngineClient(tls_gateway, timeout=5) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.get_num_unfinished_requests()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
