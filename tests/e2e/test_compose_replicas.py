"""docker-compose.replicas.yml puts a second engine in the same ring: every stage that talks
to engines names both, both record KV events, the tokenizer routes kv-aware, and the new
engine gets the stage token like the others (it listens beyond loopback)."""

from __future__ import annotations

import yaml

from strand.services.common.engine_replicas import parse_engine_addresses
from strand.services.launch import REPO_ROOT


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_the_replicas_override_puts_engine_b_in_the_same_ring() -> None:
    base = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    override = yaml.safe_load((REPO_ROOT / "docker-compose.replicas.yml").read_text())
    services = override["services"]
    engines = ["engine:50053", "engine-b:50053"]
    for stage in ("tokenizer", "detokenizer", "gateway"):
        assert stage in base
        assert parse_engine_addresses(_flag(services[stage]["command"], "--engine-addr")) == \
            engines
    for engine in ("engine", "engine-b"):
        assert "--kv-events" in services[engine]["command"]
        assert _flag(services[engine]["command"], "--port") == "50053"
    assert _flag(services["tokenizer"]["command"], "--router-policy") == "kv-aware"
    assert "STRAND_STAGE_TOKEN" in services["engine-b"]["environment"]
    assert "models:/models" in services["engine-b"]["volumes"]
