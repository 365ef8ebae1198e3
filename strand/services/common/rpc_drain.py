"""The end of a stage's stop: the calls gRPC cancelled are let finish before the loop closes.

`server.stop(grace)` returns once gRPC's core has ended every call, but grpc.aio ends each call's
Python handler afterwards, on the event loop, as the core's cancellation reaches it. A stage that
returned from its main coroutine at once left those handler tasks to `asyncio.run`, which
cancels whatever is still pending; grpc.aio then logged each one as an error with a
CancelledError traceback ("Exception not handled by _handle_exceptions in servicer method
[/strand.v1.Tokenizer/Session]"), printed the traceback again, and a clean stop of the stack
looked like a crash in about one run in five. Waiting for them (they end within milliseconds)
keeps the stop quiet.
"""

from __future__ import annotations

import asyncio

DRAIN_TIMEOUT_S = 1.0  # a bound, not a wait: the handlers end within milliseconds

# The names grpc.aio gives the tasks of a call's handler (grpcio 1.6x-1.8x).
_RPC_TASK = "rpc_task"
_RPC_WRAPPER_PREFIX = "HandleExceptions["


def is_rpc_task(task: asyncio.Task[object]) -> bool:
    name = task.get_name()
    return name == _RPC_TASK or name.startswith(_RPC_WRAPPER_PREFIX)


async def drain_cancelled_rpcs(timeout_s: float = DRAIN_TIMEOUT_S) -> int:
    """Wait (at most timeout_s) for the call handlers still running after `server.stop`;
    returns how many were still running when it gave up (0 when all ended)."""
    rpcs = [t for t in asyncio.all_tasks() if is_rpc_task(t) and t is not asyncio.current_task()]
    if not rpcs:
        return 0
    _, pending = await asyncio.wait(rpcs, timeout=timeout_s)
    return len(pending)
