"""The front's graceful drain on SIGTERM or SIGINT (the gateway's, gateway/drain.py, over HTTP).

uvicorn closes its listener on the first signal, so a client's next request met "connection
refused" and a load balancer was not told. Here the first signal only sets `draining`: every new
request (/health included: not ready) gets a 503 saying so, while the ones in flight, streams
included, go on. The server stops once none is left or the shutdown timeout has passed (plus a
little, for the gateway's aborts of what it still ran to reach their streams); a second signal
stops it at once.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from strand.services.common.status import DRAINING_MESSAGE
from strand.services.openai.errors import unavailable

logger = logging.getLogger(__name__)

# After the shutdown timeout the gateway ends what is left with finish_reason "abort": the time
# those last outputs get to reach their HTTP clients.
ABORT_GRACE_S = 2.0
# Paths still answered while draining: a scrape of the front's metrics is not a request.
_ANSWERED_WHILE_DRAINING = ("/metrics",)


@dataclass(slots=True)
class DrainState:
    draining: bool = False
    num_in_flight: int = 0  # HTTP requests taken and not yet answered (a stream: until its end)


class Draining:
    """Plain ASGI (see ApiKeyCheck): counts the requests in flight; a 503 once draining."""

    def __init__(self, app: ASGIApp, state: DrainState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _ANSWERED_WHILE_DRAINING:
            await self.app(scope, receive, send)
            return
        if self.state.draining:
            await unavailable(DRAINING_MESSAGE).response()(scope, receive, send)
            return
        self.state.num_in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.num_in_flight -= 1


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose first signal drains (see the module's doc) instead of stopping."""

    def __init__(self, config: uvicorn.Config, state: DrainState, timeout_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.timeout_s = timeout_s
        self._deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not uvicorn's: it raises the signal again once stopped, so SIGTERM ended the process
        # with -15 instead of 0.
        if self._deadline is not None:
            logger.warning("%s while draining: stopping now", signal.Signals(sig).name)
            self.should_exit = True
            return
        self.state.draining = True
        self._deadline = time.monotonic() + self.timeout_s + ABORT_GRACE_S
        if self.state.num_in_flight:
            logger.info("draining: %d HTTP requests in flight, waiting up to %g s",
                        self.state.num_in_flight, self.timeout_s)

    async def on_tick(self, counter: int) -> bool:
        if self._deadline is not None and (not self.state.num_in_flight
                                           or time.monotonic() >= self._deadline):
            self.should_exit = True
        return await super().on_tick(counter)
