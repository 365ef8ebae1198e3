"""When the engine steps: every case, in one file.

The engine computes only when a step is driven. Who drives it depends on the mode, and each rule
that decides *when* lives here; the files that carry the steps out (the gateway's self-stepper,
the engine stage's auto loop, AsyncLLM's thread) ask these objects and do nothing else on their
own account.

| policy | where | who steps | when |
|---|---|---|---|
| MANUAL | `LLMEngine`; the engine stage by default | the caller: `LLMEngine.step()`, or a client's Step RPC (the gateway sends one Step message to each engine replica) | once per call |
| SELF_STEP | the gateway, in manual mode | the gateway, for Generate streams that no Step call drives (a client that only reads its stream) | after `SelfStepClock.after` seconds with no Step call and no new stream; after a step that left the engine idle, the next one waits for an add |
| AUTO | the engine stage with `--auto-step`; `AsyncLLM` | the engine itself | while it has unfinished requests (and, in the stage, a subscriber for its outputs) |
| BURST_HOLD | inside AUTO | - | a step about to run waits while adds keep arriving (`AddBursts`), so a burst of streams joins one step; a lone add to an idle engine is not held |
| BACK_TO_BACK | inside AUTO, the engine stage | - | on the core's thread the next step follows at once, without handing the thread back to the event loop, while `BackToBack.go_on` says so |

The gateway learns the engine's mode from its GetInfo (`auto_step`): in AUTO it neither forwards
Step calls nor self-steps.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass


class StepPolicy(enum.Enum):
    MANUAL = "manual"
    SELF_STEP = "self_step"
    AUTO = "auto"
    BURST_HOLD = "burst_hold"
    BACK_TO_BACK = "back_to_back"


# -- SELF_STEP --------------------------------------------------------------------------------

# A Generate stream steps itself after this long without a Step call or a new stream.
SELF_STEP_AFTER_S = 1.0


class SelfStepClock:
    """Whether Generate streams in manual mode may step the engine themselves.

    A client that drives Generate with Step calls (EngineClient.generate) keeps control: each of
    its calls restarts the wait. One that only reads its stream (grpcurl) is not left waiting
    forever. A new stream restarts the wait too, so a client that opens a stream and then steps
    gets the chance to."""

    def __init__(self, after: float = SELF_STEP_AFTER_S) -> None:
        if not after > 0:
            raise ValueError(f"self_step_after must be > 0 seconds, got {after}")
        self.after = after
        self.last_step_call = -math.inf
        self.last_stream_added = -math.inf

    def note_step_call(self, now: float | None = None) -> None:
        self.last_step_call = time.monotonic() if now is None else now

    def note_stream_added(self, now: float | None = None) -> None:
        self.last_stream_added = time.monotonic() if now is None else now

    def wait_s(self, now: float | None = None) -> float:
        """Seconds until Generate streams may step themselves (<= 0: now)."""
        now = time.monotonic() if now is None else now
        return max(self.last_step_call, self.last_stream_added) + self.after - now


# -- BURST_HOLD -------------------------------------------------------------------------------

# The held step waits for a pause in adds this long.
ADD_QUIET_S = 0.002
# A sustained stream of adds delays a step by at most this.
MAX_ADD_HOLD_S = 0.05


class AddBursts:
    """When an auto-stepping engine (the engine stage, AsyncLLM) holds its next step for more
    adds.

    A burst of requests (a client opening many streams at once) arrives as one add message each.
    Stepped at once, each add would wait for the step before it on the core's one thread, and the
    burst would join one step per request; held until the adds pause, it joins one step
    together, as a loop that adds them all and then steps.

    An add holds the next step until adds have paused for `quiet_s`, unless it is lone: it
    reached an idle engine (nothing unfinished) and no add came in the quiet time before it. A
    lone add has nothing to be gathered with, and holding it is pure latency on a request's first
    token at low load. A burst that follows it (the tokenizer sends adds one after another, so
    the second arrives while that first step runs, to a busy engine) is held and joins the next
    step together: a burst costs one extra step for its first request. Holding every add, lone
    ones too, keeps throughput but taxes every lone first token; holding none splits bursts over
    many steps and costs throughput."""

    def __init__(self, quiet_s: float = ADD_QUIET_S, max_hold_s: float = MAX_ADD_HOLD_S) -> None:
        self.quiet_s = quiet_s
        self.max_hold_s = max_hold_s
        self._last_add = float("-inf")
        self._lone = False

    def note_add(self, now: float, engine_was_idle: bool = False) -> None:
        """An add, done at `now`; `engine_was_idle`: the core had nothing unfinished when it came."""
        self._lone = engine_was_idle and now - self._last_add >= self.quiet_s
        self._last_add = now

    def hold(self, now: float, held_since: float) -> bool:
        """Whether a step about to run at `now` (first held at `held_since`) should wait."""
        return (not self._lone and now - self._last_add < self.quiet_s
                and now - held_since < self.max_hold_s)


# -- BACK_TO_BACK -----------------------------------------------------------------------------

# The next step runs at once, without handing the thread back to the event loop (two thread
# wake-ups a step), only after a step this long. The step that follows at once holds the GIL in
# its Python parts while the loop wants it to send the last step's message: on a loaded machine
# that delays the message by up to a millisecond. Against a long step (a large batch) that is
# little and the saved hand-off counts; against a short one (a lone request, whose user waits on
# every token) the message goes first.
BACK_TO_BACK_MIN_S = 0.02


@dataclass(frozen=True, slots=True)
class BackToBack:
    min_s: float = BACK_TO_BACK_MIN_S

    def go_on(self, *, more: bool, step_s: float, has_message: bool, subscribed: bool,
              others_waiting: bool, undelivered: int) -> bool:
        """Whether the engine stage's core thread runs the next step at once.

        more: work remains; step_s: how long the step just run took; has_message: it produced a
        message for the loop to send (every output held, final_only_hold.py, makes none);
        subscribed: a detokenizer reads the outputs; others_waiting: a Session call waits for
        the thread; undelivered: step messages posted to the loop and not yet in the hub (the
        detokenizer must keep up: one on its way at most)."""
        long_or_silent = not has_message or step_s >= self.min_s
        return (more and long_or_silent and subscribed and not others_waiting
                and undelivered <= 1)
