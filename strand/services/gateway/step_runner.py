"""Manual mode's steps (Step calls and Generate self-steps): one Step message to each engine
replica in rotation, each with its own step id, then a wait for each step's outputs, which come
back through the detokenizer tagged with that id (the gateway's output feed hands them here).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import grpc

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.status import StageError, StageUnavailable
from strand.services.common.tracing import carrier_from_context
from strand.services.gateway.replica_reports import answers

# A Step's outputs cross the detokenizer after the engine has run it; past this they are lost
# (the detokenizer died with them) and the Step fails as UNAVAILABLE.
STEP_OUTPUTS_TIMEOUT_S = 10.0

Streamed = list[tuple[str, str]]  # the (client, id) of Generate requests a step streamed to


class StepRunner:
    def __init__(self, engines: EngineReplicas, origin: str,
                 added_ids: Callable[[], list[str]],
                 end_lost: Callable[[list[str]], None]) -> None:
        self.engines = engines
        self.origin = origin
        self._added_ids = added_ids  # live requests whose adds the engines have answered
        self._end_lost = end_lost
        self._step_ids = itertools.count(1)
        self._waiters: dict[int, asyncio.Future[Streamed]] = {}
        self._replica: dict[int, str] = {}  # step id -> the replica it stepped
        self.engine_idle = False  # the last step left the engines with nothing to compute
        # A replica that leaves the rotation mid-step took its step's outputs with it (its
        # requests end with "error" through the detokenizer): that step has nothing to wait for.
        engines.listeners.append(self._replica_left)

    async def step_once(self) -> Streamed:
        """One step of every replica in rotation; the (client, id) of the Generate requests
        their outputs streamed to. A replica that fails is out of rotation: its requests end
        with "error" through the detokenizer, and the others' step stands."""
        names = self.engines.in_rotation() or self.engines.names  # none: try all (fan_out)
        step_ids = {name: next(self._step_ids) for name in names}
        loop = asyncio.get_running_loop()
        waiters: dict[int, asyncio.Future[Streamed]] = {
            step_id: loop.create_future() for step_id in step_ids.values()}
        self._waiters.update(waiters)
        self._replica.update({step_id: name for name, step_id in step_ids.items()})
        added = self._added_ids()  # requests the engines surely hold before this step
        carrier = carrier_from_context()
        try:
            results = answers(await self.engines.fan_out(lambda name: epb.EngineRequest(
                step=epb.EngineStep(step_id=step_ids[name], origin=self.origin),
                trace_context=carrier), names))
            stepped = {step_ids[n]: r for n, r in results.items() if not isinstance(r, StageError)}
            done, _ = await asyncio.wait([waiters[i] for i in stepped],
                                         timeout=STEP_OUTPUTS_TIMEOUT_S)
            streamed: Streamed = []
            for step_id in stepped:
                if waiters[step_id] not in done:
                    raise StageUnavailable("detokenizer", f"the outputs of step {step_id} did "
                                           f"not arrive within {STEP_OUTPUTS_TIMEOUT_S:.0f}s")
                streamed += waiters[step_id].result()
        finally:
            for step_id in waiters:
                self._waiters.pop(step_id, None)
                self._replica.pop(step_id, None)
        self.engine_idle = len(stepped) == len(names) and all(
            r.state.num_unfinished_requests == 0 for r in stepped.values())
        if self.engine_idle:
            # The step's outputs are all delivered by now, finals included: a request that is
            # still live was removed from the engine behind the gateway's back. Its client
            # would wait forever (and self-steps would spin): end it.
            self._end_lost(added)
        return streamed

    def on_outputs(self, step_id: int, streamed: Streamed) -> None:
        """A step's outputs have been delivered."""
        waiter = self._waiters.get(step_id) if step_id else None
        if waiter is not None and not waiter.done():
            waiter.set_result(streamed)

    def fail_all(self, reason: str) -> None:
        """The detokenizer is lost: no waiting step's outputs will come."""
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(StageError(grpc.StatusCode.UNAVAILABLE, reason))

    def _replica_left(self, replica: str, in_rotation: bool) -> None:
        if in_rotation:
            return
        for step_id, name in self._replica.items():
            waiter = self._waiters.get(step_id)
            if name == replica and waiter is not None and not waiter.done():
                waiter.set_result([])
