"""The supervisor restarts a service that exits, after a back-off that doubles while it keeps
dying and starts over once it stayed up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strand.services.supervisor import FIRST_BACKOFF_S, MAX_BACKOFF_S, STABLE_AFTER_S, Supervisor


@dataclass
class FakeProcess:
    code: int | None = None

    def poll(self) -> int | None:
        return self.code


@dataclass
class FakeStack:
    processes: dict[str, FakeProcess] = field(default_factory=dict)
    starts: list[str] = field(default_factory=list)

    def start_async(self, name: str) -> None:
        self.starts.append(name)
        self.processes[name] = FakeProcess()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _supervisor() -> tuple[Supervisor, FakeStack, Clock, list[str]]:
    stack = FakeStack({"engine": FakeProcess(), "tokenizer": FakeProcess()})
    clock, lines = Clock(), list[str]()
    supervisor = Supervisor(stack, log=lines.append, clock=clock)  # type: ignore[arg-type]
    supervisor.tick()
    return supervisor, stack, clock, lines


def _die_and_restart(supervisor: Supervisor, stack: FakeStack, clock: Clock) -> float:
    """Kill the engine; the back-off after which it was restarted."""
    stack.processes["engine"].code = -9
    supervisor.tick()
    died = clock.now
    while "engine" not in supervisor.tick():
        clock.now += 0.5
    return clock.now - died


def test_a_dead_service_is_restarted_after_a_doubling_backoff() -> None:
    supervisor, stack, clock, lines = _supervisor()
    waits = [_die_and_restart(supervisor, stack, clock) for _ in range(7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert waits[0] == FIRST_BACKOFF_S and max(waits) == MAX_BACKOFF_S
    assert stack.starts == ["engine"] * 7
    assert lines[0] == "strand: engine exited with code -9; restarting in 1 s"
    assert lines[1] == "strand: engine restarted"


def test_the_backoff_starts_over_once_the_service_stayed_up() -> None:
    supervisor, stack, clock, _ = _supervisor()
    _die_and_restart(supervisor, stack, clock)
    _die_and_restart(supervisor, stack, clock)
    supervisor.tick()
    clock.now += STABLE_AFTER_S
    assert _die_and_restart(supervisor, stack, clock) == FIRST_BACKOFF_S


def test_other_services_are_left_alone() -> None:
    supervisor, stack, clock, _ = _supervisor()
    tokenizer: Any = stack.processes["tokenizer"]
    _die_and_restart(supervisor, stack, clock)
    assert stack.processes["tokenizer"] is tokenizer
