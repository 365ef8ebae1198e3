"""The OpenAI front's API key: `Authorization: Bearer <key>` on the routes that reach the
gateway (which the front calls with the same key)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from strand.services.openai.errors import OpenAIError

# Paths that take the API key: vLLM's /v1/ routes, and the tokenizer's, which reach the gateway
# with the front's own key.
_KEYED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


class ApiKeyCheck:
    """401 for a /v1/ request without `Authorization: Bearer <key>`. Plain ASGI: Starlette's
    @app.middleware("http") runs every response (streams included) through a task group and a
    memory stream of its own, which cost a request more than its check."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_KEYED_PREFIXES):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):  # in time independent of the key
                response = OpenAIError(401, "invalid or missing API key", param=None,
                                       code="invalid_api_key").response()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
