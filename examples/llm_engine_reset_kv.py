"""Step an LLMEngine by hand and reset the prefix cache mid-flight (vLLM's llm_engine_reset_kv).

    python examples/llm_engine_reset_kv.py            # a tiny random model, built locally
    python examples/llm_engine_reset_kv.py --model /path/to/hf-dir
"""

from __future__ import annotations

import argparse

from strand.engine_core import EngineArgs, LLMEngine, RequestOutput, SamplingParams

RESET_AT_STEP = 10


def test_prompts() -> list[tuple[str, SamplingParams]]:
    return [
        ("A robot may not injure a human being",
         SamplingParams(temperature=0.0, logprobs=1, prompt_logprobs=1, max_tokens=24)),
        ("To be or not to be,",
         SamplingParams(temperature=0.8, top_p=0.95, n=2, max_tokens=24, seed=0)),
    ]


def run(engine: LLMEngine, prompts: list[tuple[str, SamplingParams]]) -> list[RequestOutput]:
    finished: list[RequestOutput] = []
    request_id = 0
    step = 0
    while prompts or engine.has_unfinished_requests():
        if prompts:
            prompt, params = prompts.pop(0)
            engine.add_request(str(request_id), prompt, params)
            request_id += 1
        if step == RESET_AT_STEP:
            # Running requests are preempted and recomputed: outputs do not change.
            ok = engine.reset_prefix_cache(reset_running_requests=True)
            print(f"step {step}: reset_prefix_cache(reset_running_requests=True) -> {ok}")
        for output in engine.step():
            assert isinstance(output, RequestOutput)  # a generating engine's
            if output.finished:
                finished.append(output)
                for completion in output.outputs:
                    print(f"request {output.request_id}.{completion.index} "
                          f"[{completion.finish_reason}] {output.prompt!r} -> {completion.text!r}")
        step += 1
    return finished


def main() -> None:
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser(description=__doc__))
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(parser.parse_args()))
    run(engine, test_prompts())


if __name__ == "__main__":
    main()
