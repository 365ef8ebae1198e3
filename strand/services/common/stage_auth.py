"""The internal stages are inside the security boundary: with a stage token (env
STRAND_STAGE_TOKEN, never a flag: argv is visible to every user of the machine) each stage
requires it from its callers (`authorization: Bearer <token>`, as the gateway's --api-key), and a
stage asked to listen beyond loopback refuses to start without one. `strand serve` makes a
fresh token for every stack."""

from __future__ import annotations

import ipaddress
import secrets

from strand import envs
from strand.services.common.errors import UserError
from strand.services.common.stage_protocol import PROTOCOL, PROTOCOL_HEADER

STAGE_TOKEN_ENV = "STRAND_STAGE_TOKEN"
STAGES = ("tokenizer", "engine", "detokenizer")


def stage_token() -> str | None:
    return envs.stage_token()


def new_stage_token() -> str:
    return secrets.token_urlsafe(24)


def stage_metadata() -> tuple[tuple[str, str], ...]:
    """What a stage's caller sends: the stage protocol it speaks (stage_protocol.py), and the
    token when one is set."""
    token = stage_token()
    auth = (("authorization", f"Bearer {token}"),) if token else ()
    return ((PROTOCOL_HEADER, PROTOCOL), *auth)


def stage_api_key(name: str, host: str, api_key: str | None) -> str | None:
    """The key a stage server requires: its --api-key, else the stage token. UserError when a
    stage would listen beyond loopback with neither."""
    if name not in STAGES:
        return api_key  # the gateway and the fronts: their clients' key, not the stages'
    key = api_key or stage_token()
    if key is None and not _is_loopback(host):
        raise UserError(f"{name}: --host {host} would expose an internal stage to the network "
                        f"unauthenticated; set {STAGE_TOKEN_ENV} (the same value for every "
                        f"stage and the gateway) or bind 127.0.0.1")
    return key


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
