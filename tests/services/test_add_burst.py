"""The auto-stepping engine holds a step for a burst of adds, never for a lone one."""

from __future__ import annotations

from services.engine.add_burst import AddBursts


def test_a_lone_add_is_stepped_at_once() -> None:
    bursts = AddBursts(quiet_s=0.002, max_hold_s=0.05)
    bursts.note_add(10.0)
    assert not bursts.hold(10.0001, held_since=10.0001)
    bursts.note_add(11.0)  # the next one a second later is lone too
    assert not bursts.hold(11.0001, held_since=11.0001)


def test_a_burst_is_held_until_the_adds_pause() -> None:
    bursts = AddBursts(quiet_s=0.002, max_hold_s=0.05)
    bursts.note_add(10.0)
    bursts.note_add(10.0005)  # the second add within the quiet time marks a burst
    assert bursts.hold(10.001, held_since=10.001)
    assert not bursts.hold(10.003, held_since=10.001)  # paused for quiet_s: step


def test_a_sustained_stream_of_adds_delays_a_step_by_at_most_max_hold() -> None:
    bursts = AddBursts(quiet_s=0.002, max_hold_s=0.05)
    t = 10.0
    while t < 10.2:
        bursts.note_add(t)
        t += 0.001
    assert bursts.hold(10.04, held_since=10.0)
    assert not bursts.hold(10.06, held_since=10.0)


def test_after_a_pause_the_next_lone_add_is_not_held() -> None:
    bursts = AddBursts(quiet_s=0.002, max_hold_s=0.05)
    bursts.note_add(10.0)
    bursts.note_add(10.0005)
    bursts.note_add(10.5)
    assert not bursts.hold(10.5001, held_since=10.5001)
