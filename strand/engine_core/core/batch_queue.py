"""BatchQueue: up to N scheduled batches in flight (vLLM's batch queue, max_concurrent_batches).

The engine thread schedules batch N+1 while a single worker thread computes batch N, so the
scheduler's Python time hides behind the forward pass. The worker runs batches one at a time, in
the order they were scheduled, so the model runner sees the same sequence of SchedulerOutputs as
without the queue; results are applied (update_from_output) in that order too.

It queues without checking whether the oldest batch is done: the engine fills the queue, then
waits for the oldest result. That keeps a step's outputs independent of timing (the same calls
give the same outputs), at the cost of one step of latency when the worker is already idle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from strand.engine_core.core.runner_output import ModelRunnerOutput
from strand.engine_core.core.sched_output import SchedulerOutput


class BatchQueue:
    def __init__(self, max_batches: int,
                 execute: Callable[[SchedulerOutput], ModelRunnerOutput]) -> None:
        if max_batches < 2:
            raise ValueError(f"max_batches must be >= 2 for a batch queue, got {max_batches}")
        self.max_batches = max_batches
        self._execute = execute
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strand-runner")
        # Newest on the left, oldest on the right (vLLM's order).
        self._queue: deque[tuple[Future[ModelRunnerOutput], SchedulerOutput]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def full(self) -> bool:
        return len(self._queue) >= self.max_batches

    def submit(self, scheduler_output: SchedulerOutput) -> None:
        future = self._worker.submit(self._execute, scheduler_output)
        self._queue.appendleft((future, scheduler_output))

    def newest(self) -> SchedulerOutput:
        return self._queue[0][1]

    def pop_oldest(self) -> tuple[SchedulerOutput, ModelRunnerOutput]:
        """Wait for the oldest batch; its output (the worker's exception is raised here)."""
        future, scheduler_output = self._queue.pop()
        return scheduler_output, future.result()

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True)
