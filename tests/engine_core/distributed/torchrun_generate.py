"""Run by torchrun on every rank (tests/engine_core/distributed/test_torchrun.py): the same script on each;
rank 0 is the engine and writes its greedy tokens, the other ranks serve it inside
from_engine_args and exit there."""

from __future__ import annotations

import json
import sys

from strand.engine_core import EngineArgs, LLMEngine, SamplingParams
from strand.engine_core.outputs import RequestOutput

PROMPTS = [[5, 17, 33, 90, 12, 7, 300, 41, 8, 2, 77], [9, 9, 120, 64]]


def generate(engine: LLMEngine) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=6)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    tokens: dict[str, list[int]] = {}
    for _ in range(100):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                tokens[out.request_id] = list(out.outputs[0].token_ids)
    return tokens


def main(model: str, out_path: str, tp: int) -> None:
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=model, dtype="float32", device="cpu", tensor_parallel_size=tp, cpu_threads=1,
        num_gpu_blocks_override=32))
    try:
        tokens = generate(engine)
    finally:
        engine.shutdown()
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(tokens, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
