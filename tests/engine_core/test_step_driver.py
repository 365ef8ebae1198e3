"""The step driver's policies (strand/engine_core/step_driver.py): BURST_HOLD holds an auto-stepping
engine's step until adds pause, at most MAX_ADD_HOLD_S, unless the add is lone (an idle engine, no
add just before it); SELF_STEP lets an undriven Generate stream step after a quiet time;
BACK_TO_BACK runs the next step at once only when nothing is owed to anyone else."""

from __future__ import annotations

import pytest

from strand.engine_core.step_driver import AddBursts, BackToBack, SelfStepClock


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


def test_self_step_waits_after_the_last_step_call_or_new_stream() -> None:
    clock = SelfStepClock(after=1.0)
    assert clock.wait_s(now=0.0) < 0  # nothing ever came: a stream may step at once
    clock.note_stream_added(now=10.0)
    assert clock.wait_s(now=10.5) == pytest.approx(0.5)
    clock.note_step_call(now=10.8)  # a client that steps keeps control
    assert clock.wait_s(now=11.5) == pytest.approx(0.3)
    assert clock.wait_s(now=11.9) < 0


def test_self_step_after_must_be_positive() -> None:
    with pytest.raises(ValueError, match="self_step_after must be > 0"):
        SelfStepClock(after=0.0)


@pytest.mark.parametrize(("step_s", "has_message", "expected"), [
    (0.001, True, False),  # a short step's message goes to the loop first
    (0.001, False, True),  # nothing to send: no reason to hand the thread back
    (0.05, True, True),  # a long step: the saved hand-off counts
])
def test_back_to_back_only_after_long_or_silent_steps(step_s: float, has_message: bool,
                                                      expected: bool) -> None:
    policy = BackToBack(min_s=0.02)
    assert policy.go_on(more=True, step_s=step_s, has_message=has_message, subscribed=True,
                        others_waiting=False, undelivered=0) is expected


@pytest.mark.parametrize(("more", "subscribed", "others_waiting", "undelivered"), [
    (False, True, False, 0),  # no work left
    (True, False, False, 0),  # no detokenizer reads the outputs
    (True, True, True, 0),  # a Session call waits for the thread
    (True, True, False, 2),  # the detokenizer is behind
])
def test_back_to_back_gives_the_thread_back(more: bool, subscribed: bool, others_waiting: bool,
                                            undelivered: int) -> None:
    assert not BackToBack(min_s=0.0).go_on(
        more=more, step_s=1.0, has_message=True, subscribed=subscribed,
        others_waiting=others_waiting, undelivered=undelivered)
