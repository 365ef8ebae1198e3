"""The engine stage holds the tokens of a FINAL_ONLY request until the detokenizer needs them.

A FINAL_ONLY request without stop strings or logprobs has nothing to say between its first
token and its end: no output goes to its client, no stop string can end it in the detokenizer.
Sending its token every step anyway cost the detokenizer a wake-up and its per-request Python
a step, and on a 2-core host that CPU is taken from the engine's own threads mid-step. So its
tokens stay here (on the core's thread) and go out in one output with the request's end (or
when HOLD_MAX_TOKENS have gathered), with each token's step time, from which the detokenizer
records the same per-token metrics it would have recorded step by step. The first output always
goes at once (time to first token, the scheduling events). What the detokenizer makes of the
tokens is the same: its decode runs token by token over the same ids in both cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams

# Tokens held per request before they go out anyway: bounds the memory held here and the size of
# the message that carries them (each token is an id and a time), and lets a very long request's
# metrics advance as it runs.
HOLD_MAX_TOKENS = 256


def holdable(params: SamplingParams) -> bool:
    """True when the detokenizer has no use for the request's tokens before its end."""
    return (params.output_kind == RequestOutputKind.FINAL_ONLY and not params.stop
            and params.logprobs is None and params.prompt_logprobs is None)


@dataclasses.dataclass(slots=True)
class _Held:
    token_ids: list[int] = dataclasses.field(default_factory=list)
    times: list[float] = dataclasses.field(default_factory=list)
    num_cached_tokens: int = 0
    sent_first: bool = False


class FinalOnlyHold:
    """Used on the engine core's thread only (no lock)."""

    def __init__(self, max_tokens: int = HOLD_MAX_TOKENS) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self._held: dict[str, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def num_held_tokens(self, request_id: str) -> int:
        held = self._held.get(request_id)
        return 0 if held is None else len(held.token_ids)

    def added(self, requests: Iterable[EngineCoreRequest]) -> None:
        for request in requests:
            if holdable(request.sampling_params):
                self._held[request.request_id] = _Held()
            else:
                self._held.pop(request.request_id, None)  # an id reused by a streaming request

    def forget(self, request_ids: Iterable[str]) -> None:
        """Requests that left the core without an output (aborted): their tokens go nowhere."""
        for request_id in request_ids:
            self._held.pop(request_id, None)

    def clear(self) -> None:
        self._held.clear()

    def prune(self, in_core: Collection[str]) -> None:
        """Drop what is held for requests the core no longer has (however they left it)."""
        if len(self._held) > len(in_core):
            for request_id in [r for r in self._held if r not in in_core]:
                del self._held[request_id]

    def apply(self, step: EngineCoreOutputs) -> EngineCoreOutputs:
        """The step's outputs less the ones held; an output that goes out carries what was held
        before it."""
        if not self._held:
            return step
        sent: list[EngineCoreOutput] = []
        changed = False
        for output in step.outputs:
            held = self._held.get(output.request_id)
            if held is None:
                sent.append(output)
            elif self._holds(held, output):
                held.token_ids.extend(output.new_token_ids)
                held.times.extend([step.timestamp] * len(output.new_token_ids))
                held.num_cached_tokens = max(held.num_cached_tokens, output.num_cached_tokens)
                changed = True
            else:
                released = self._release(held, output)
                sent.append(released)
                changed = changed or released is not output
                if output.finished:
                    del self._held[output.request_id]
        return dataclasses.replace(step, outputs=sent) if changed else step

    def _holds(self, held: _Held, output: EngineCoreOutput) -> bool:
        # Anything besides plain tokens (a finish, scheduling events) goes out at once.
        return (not output.has_extras and held.sent_first
                and len(held.token_ids) + len(output.new_token_ids) <= self.max_tokens)

    @staticmethod
    def _release(held: _Held, output: EngineCoreOutput) -> EngineCoreOutput:
        # Holding starts after the first token has gone out (its time is the request's TTFT).
        held.sent_first = held.sent_first or bool(output.new_token_ids)
        if not held.token_ids:
            return output
        released = dataclasses.replace(
            output, new_token_ids=held.token_ids + output.new_token_ids, held_times=held.times,
            num_cached_tokens=max(held.num_cached_tokens, output.num_cached_tokens))
        held.token_ids, held.times = [], []
        return released


__all__ = ["HOLD_MAX_TOKENS", "FinalOnlyHold", "holdable"]
