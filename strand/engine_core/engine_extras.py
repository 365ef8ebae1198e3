"""Engine-wide calls beyond stepping: collective RPC over workers and torch profiling.

Kept apart from EngineCore so the tensor-parallel work can swap the worker list without
touching the stepping code; every result is plain data so a Control service can forward it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from strand import envs

PROFILER_DIR_ENV = "STRAND_TORCH_PROFILER_DIR"


def collective_rpc(workers: Sequence[object], method: str | Callable[..., Any],
                   args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
    """Call `method` (a name, or a callable taking the worker first) on every worker, in order."""
    kw = kwargs or {}
    results: list[Any] = []
    for worker in workers:
        if isinstance(method, str):
            fn = getattr(worker, method, None)
            if not callable(fn):
                raise ValueError(f"method must name a callable on the worker "
                                 f"({type(worker).__name__}), got {method!r}")
            results.append(fn(*args, **kw))
        else:
            results.append(method(worker, *args, **kw))
    return results


class TorchProfiler:
    """start()/stop() around torch.profiler; stop() writes a Chrome trace into the directory."""

    def __init__(self, trace_dir: str | None = None) -> None:
        self.trace_dir = trace_dir or envs.torch_profiler_dir()
        self._profiler: torch.profiler.profile | None = None
        self._count = 0

    def start(self) -> None:
        if not self.trace_dir:
            raise ValueError(f"profiling needs a trace directory: set {PROFILER_DIR_ENV}")
        if self._profiler is not None:
            raise ValueError("the profiler is already running (call stop_profile first)")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities, record_shapes=True)
        self._profiler.__enter__()

    def stop(self) -> str:
        """The path of the trace file written."""
        if self._profiler is None:
            raise ValueError("the profiler is not running (call start_profile first)")
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        out_dir = Path(self.trace_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self._count += 1
        path = out_dir / f"strand_trace_{os.getpid()}_{self._count}.json"
        profiler.export_chrome_trace(str(path))
        return str(path)
