"""Graceful drain on SIGTERM (vLLM's --shutdown-timeout).

The gateway's readiness has turned NOT_SERVING (a load balancer stops sending); from here new
AddRequest and Generate calls get UNAVAILABLE with DRAINING_MESSAGE, while the requests in flight
go on, Step calls and the self-stepper included, until none is left or the timeout runs out.
What is left then ends with finish_reason "abort": a Generate stream gets its final output, a
Step-fed request's final output waits in its client's outbox. Only then does the server stop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from strand.services.common.status import StageError
from strand.services.gateway.live import abort_output

if TYPE_CHECKING:
    from strand.services.gateway.flow import GatewayFlow

logger = logging.getLogger(__name__)

_POLL_S = 0.05  # how often the count of requests in flight is looked at


async def drain(flow: GatewayFlow, timeout_s: float, cut_short: asyncio.Event) -> int:
    """Refuse new requests, let the ones in flight finish (at most timeout_s, or until
    cut_short is set: a second signal), then abort what is left; how many were aborted."""
    flow.draining = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    if flow.num_live:
        logger.info("draining: %d requests in flight, waiting up to %g s", flow.num_live,
                    timeout_s)
    while flow.num_live and not cut_short.is_set():
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            await asyncio.wait_for(cut_short.wait(), min(_POLL_S, remaining))
        except TimeoutError:
            pass
    left = flow.live_requests()
    if not left:
        return 0
    logger.warning("draining: aborting the %d requests still in flight after %g s", len(left),
                   timeout_s)
    try:
        await flow.abort_internal([live.request_id for live in left])
    except StageError as exc:  # the streams got their last output all the same
        logger.warning("draining: the stages did not confirm the aborts: %s", exc)
    for live in left:
        if live.queue is None:
            flow.outboxes.get(live.client).put(abort_output(live.public_id, live.num_outputs))
    return len(left)
