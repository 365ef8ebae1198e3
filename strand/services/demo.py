"""The README's step-by-step example: add requests one per step, reset the prefix cache at step 10.

`run_seed_loop` takes anything with LLMEngine's methods, so the same loop runs in process
(LLMEngine) and through the gateway (EngineClient), and the two must print the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.outputs import PoolingRequestOutput, RequestOutput
from strand.engine_core.sampling_params import SamplingParams

RESET_AT_STEP = 10


class EngineLike(Protocol):
    def add_request(self, request_id: str, prompt: Any, params: SamplingParams | None = None,
                    arrival_time: float | None = None, lora_request: LoRARequest | None = None,
                    priority: int = 0) -> None: ...
    def step(self) -> Sequence[RequestOutput | PoolingRequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool: ...


def seed_prompts() -> list[tuple[str, SamplingParams]]:
    """Greedy prompts (deterministic), two sharing a prefix so the cache has something to hit."""
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    return [
        ("A robot may not injure a human being", greedy),
        ("To be or not to be,", SamplingParams(temperature=0.0, max_tokens=12)),
        ("What is the meaning of life?", greedy),
        ("A robot may not injure a human being or", SamplingParams(temperature=0.0,
                                                                  max_tokens=20)),
        ("It is only with the heart that one can see rightly", greedy),
    ]


def run_seed_loop(engine: EngineLike, prompts: list[tuple[str, SamplingParams]] | None = None,
                  reset_at: int = RESET_AT_STEP, verbose: bool = False
                  ) -> tuple[list[RequestOutput], bool | None]:
    """Add one request per step, step until done; returns (finished outputs, reset result)."""
    pending = list(prompts if prompts is not None else seed_prompts())
    finished: list[RequestOutput] = []
    reset_ok: bool | None = None
    request_id = 0
    step = 0
    while pending or engine.has_unfinished_requests():
        if pending:
            prompt, params = pending.pop(0)
            engine.add_request(str(request_id), prompt, params)
            request_id += 1
        outputs = engine.step()
        step += 1
        if step == reset_at:
            # Running requests are preempted and recomputed later: their outputs do not change.
            reset_ok = engine.reset_prefix_cache(reset_running_requests=True)
            if verbose:
                print(f"step {step}: reset_prefix_cache(reset_running_requests=True) -> {reset_ok}")
        for output in outputs:
            if isinstance(output, RequestOutput) and output.finished:
                finished.append(output)
                if verbose:
                    print(f"step {step}: request {output.request_id} finished: "
                          f"{output.prompt!r} -> {output.outputs[0].text!r} "
                          f"({output.outputs[0].finish_reason})")
    return finished, reset_ok
