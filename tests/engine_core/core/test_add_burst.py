"""The auto-stepping engine holds a step until adds pause, at most MAX_ADD_HOLD_S, unless the
add is lone (an idle engine, no add just before it)."""

from __future__ import annotations

import pytest

from strand.engine_core.core.add_burst import AddBursts


def test_nothing_is_held_before_any_add() -> None:
    assert not AddBursts().hold(10.0, held_since=10.0)


def test_a_step_waits_for_a_pause_in_adds() -> None:
    bursts = AddBursts(quiet_s=0.002, max_hold_s=0.05)
    bursts.note_add(10.0)
    assert bursts.hold(10.001, held_since=10.001)
    bursts.note_add(10.0015)
    assert bursts.hold(10.003, held_since=10.001)
    assert not bursts.hold(10.0036, held_since=10.001)  # quiet for quiet_s: step


def test_a_sustained_stream_of_adds_delays_a_step_by_at_most_max_hold() -> None:
    bursts = AddBursts(quiet_s=0.002, max_hold_s=0.05)
    t = 10.0
    while t < 10.2:
        bursts.note_add(t)
        t += 0.001
    assert bursts.hold(10.04, held_since=10.0)
    assert not bursts.hold(10.06, held_since=10.0)


def test_a_zero_hold_steps_at_once() -> None:
    bursts = AddBursts(quiet_s=0.0)
    bursts.note_add(10.0)
    assert not bursts.hold(10.0, held_since=10.0)


def test_the_engine_stage_names_the_flag_and_bound(capsys: pytest.CaptureFixture[str]) -> None:
    # parser.error before anything loads: one line naming the flag and the bound.
    from strand.services.engine.__main__ import _main
    with pytest.raises(SystemExit) as exc:
        _main(["--model", "/nonexistent", "--add-hold-ms", "-1"])
    assert exc.value.code == 2
    assert "--add-hold-ms must be in [0, 50], got -1" in capsys.readouterr().err


def test_a_lone_add_to_an_idle_engine_steps_at_once() -> None:
    bursts = AddBursts(quiet_s=0.002)
    bursts.note_add(10.0, engine_was_idle=True)
    assert not bursts.hold(10.0001, held_since=10.0001)


def test_an_add_to_a_busy_engine_is_held() -> None:
    # The second add of a burst arrives while the first one's step runs.
    bursts = AddBursts(quiet_s=0.002)
    bursts.note_add(10.0, engine_was_idle=True)
    bursts.note_add(10.02, engine_was_idle=False)
    assert bursts.hold(10.021, held_since=10.021)
    assert not bursts.hold(10.023, held_since=10.021)


def test_an_add_close_behind_another_is_held_even_on_an_idle_engine() -> None:
    # Two adds within the quiet time may be the start of a burst (e.g. two tokenizer replicas).
    bursts = AddBursts(quiet_s=0.002)
    bursts.note_add(10.0, engine_was_idle=True)
    bursts.note_add(10.001, engine_was_idle=True)
    assert bursts.hold(10.0015, held_since=10.0015)
