"""A bound on an HTTP request's body: FastAPI reads a body whole before any check sees it, so a
client could make the front hold gigabytes. A declared Content-Length over the bound is refused
before a byte is read; a chunked body is counted as it comes and refused once it passes the
bound. Either way: 413 in OpenAI's error shape, naming the bound."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from strand.services.openai.errors import OpenAIError

DEFAULT_MAX_BODY_BYTES = 32 * 1024**2


class BodyLimit:
    """Plain ASGI (see ApiKeyCheck): the body is read here, at most max_bytes of it, and handed
    to the app as one message; what the app receives after it (its disconnect) passes through."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send, int(declared))
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left mid-body
                await self.app(scope, _replay(message, receive), send)
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._refuse(scope, receive, send, len(body), at_least=True)
                return
            if not message.get("more_body", False):
                break
        whole: Message = {"type": "http.request", "body": bytes(body), "more_body": False}
        await self.app(scope, _replay(whole, receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int,
                      at_least: bool = False) -> None:
        got = f"at least {size}" if at_least else str(size)
        await OpenAIError(413, f"request body must be at most {self.max_bytes} bytes, got "
                               f"{got}", param=None, code="request_too_large"
                          ).response()(scope, receive, send)


def _replay(first: Message, receive: Receive) -> Receive:
    """`receive` that gives `first` once, then the server's own messages."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if not given:
            given = True
            return first
        return await receive()
    return replayed
