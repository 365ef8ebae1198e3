"""How long the HTTP client (or the proxy in front of it) will wait for an answer, read from
the headers that say so, so that the engine stops work nobody will read (a gRPC deadline on the
call to the gateway, which carries it to the engine: docs/openai.md).

Two headers carry a timeout in practice:
- `x-envoy-expected-rq-timeout-ms`: Envoy (and Istio) tell the upstream how long they will wait
  for the whole response, in milliseconds; it holds for streams too.
- `x-stainless-read-timeout`: OpenAI's SDKs send their read timeout in seconds on every request.
  A read timeout bounds the wait for each chunk, not the whole answer, so it is a deadline only
  for a non-streaming request, whose one chunk is the whole answer.
With both, the nearer one holds. A header that is not a positive number is a 400 naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from strand.services.openai.errors import OpenAIError

ENVOY_TIMEOUT_MS = "x-envoy-expected-rq-timeout-ms"
SDK_READ_TIMEOUT_S = "x-stainless-read-timeout"


def _positive(headers: Mapping[str, str], name: str, scale: float) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise OpenAIError(400, f"header {name} must be a positive number, got {raw!r}",
                          param=name, code="invalid_header")
    return value * scale


def client_timeout_s(headers: Mapping[str, str], stream: bool) -> float | None:
    """Seconds the client will wait for this request's answer; None where no header says."""
    bounds = [_positive(headers, ENVOY_TIMEOUT_MS, 1e-3)]
    if not stream:
        bounds.append(_positive(headers, SDK_READ_TIMEOUT_S, 1.0))
    known = [b for b in bounds if b is not None]
    return min(known) if known else None
