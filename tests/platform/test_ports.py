"""Ports chosen ahead of their listeners: distinct, free, and out of the kernel's range for
outgoing connections (a stack's services, a process group's store)."""

from __future__ import annotations

import socket

import pytest

from strand.platform import ports


def test_ports_chosen_together_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low, _high = ports.ephemeral_range()
    chosen = ports.free_ports("127.0.0.1", 8)
    assert len(set(chosen)) == 8
    if low - ports.LOWEST_PORT >= 200:
        assert all(ports.LOWEST_PORT <= p < low for p in chosen)
    for port in chosen:  # each one can be listened on now
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_handed_out_lately_is_not_handed_out_again() -> None:
    first = ports.free_ports("127.0.0.1", 50)
    second = ports.free_ports("127.0.0.1", 50)
    assert not set(first) & set(second)


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    real_low, real_high = ports.ephemeral_range()
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST_PORT + 10, 65535))
    (port,) = ports.free_ports("127.0.0.1", 1)
    assert real_low <= port <= real_high  # bind(0)'s pick, not one of the ten below


def test_a_process_groups_store_port_is_below_the_ephemeral_range() -> None:
    from strand.engine_core.distributed.driver import free_port

    low, _high = ports.ephemeral_range()
    port = free_port("127.0.0.1")
    if low - ports.LOWEST_PORT >= 200:
        assert ports.LOWEST_PORT <= port < low
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
