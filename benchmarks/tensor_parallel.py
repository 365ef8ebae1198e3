"""What tensor parallelism costs on CPU: TP=1 with 2 threads vs TP=2 ranks of 1 thread each.

    python -m benchmarks.tensor_parallel [--model DIR | shape flags] [--batch-size 8]

Same cores, same model, same run: the only difference is one process splitting each matmul over
two threads, or two processes each holding half the heads and half the MLP (gloo on 127.0.0.1),
joined by an all-reduce after every attention and MLP block, plus the embedding all-reduce and
the logits gather. Per configuration:
  prefill tok/s  --batch-size prompts of --prompt-len tokens, max_tokens=1, all steps timed;
  decode tok/s   --batch-size requests decoding --output-len tokens (ignore_eos), the prefill
                 steps before the first decode step not timed;
  comm ms/step   rank 0's time inside the collectives per decode step (waiting for the slower
                 rank included: that wait is part of what TP costs).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.common import add_model_args, format_table, log, resolve_model, write_json
from strand.engine_core import EngineArgs, LLMEngine, RequestOutput, SamplingParams
from strand.engine_core.distributed.driver import TPDriverRunner


@dataclass(slots=True)
class TPResult:
    tensor_parallel_size: int
    threads_per_rank: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    comm_ms_per_decode_step: float


def _engine(model: Path, dtype: str, tp: int, threads: int) -> LLMEngine:
    return LLMEngine.from_engine_args(EngineArgs(
        model=str(model), dtype=dtype, device="cpu", tensor_parallel_size=tp,
        cpu_threads=threads, num_gpu_blocks_override=512, enable_prefix_caching=False))


def _comm_seconds(engine: LLMEngine) -> float:
    runner = engine.engine_core.runner
    return runner.take_comm_time() if isinstance(runner, TPDriverRunner) else 0.0


def _prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(count)]


def measure(model: Path, dtype: str, tp: int, threads: int, batch: int, prompt_len: int,
            output_len: int) -> TPResult:
    engine = _engine(model, dtype, tp, threads)
    try:
        vocab = engine.engine_core.vocab_size
        # Warm-up (first-call allocations, oneDNN's kernel choice): not timed.
        engine.add_request("warm", {"prompt_token_ids": _prompts(1, prompt_len, vocab, 0)[0]},
                           SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        # Prefill: every step is prompt work (max_tokens=1 ends each request at its first token).
        for i, prompt in enumerate(_prompts(batch, prompt_len, vocab, 1)):
            engine.add_request(f"p{i}", {"prompt_token_ids": prompt},
                               SamplingParams(temperature=0.0, max_tokens=1))
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        prefill_s = time.perf_counter() - start
        # Decode: prefill untimed (until every request has its first token), then time the rest.
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
        for i, prompt in enumerate(_prompts(batch, 16, vocab, 2)):
            engine.add_request(f"d{i}", {"prompt_token_ids": prompt}, params)
        started: set[str] = set()
        while len(started) < batch:
            started.update(o.request_id for o in engine.step()
                           if isinstance(o, RequestOutput) and o.outputs[0].token_ids)
        _comm_seconds(engine)  # drop the prefill's
        steps, start = 0, time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        decode_s = time.perf_counter() - start
        comm_s = _comm_seconds(engine)
    finally:
        engine.shutdown()
    return TPResult(tp, threads, batch * prompt_len / prefill_s,
                    batch * (output_len - 1) / decode_s, 1000 * comm_s / max(steps, 1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--cores", type=int, default=2,
                        help="threads in all: TP=1 uses them all, TP=2 one per rank per half")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args(argv)
    if args.cores < 2 or args.cores % 2:
        raise ValueError(f"cores must be an even number >= 2, got {args.cores}")
    if args.output_len < 2:
        raise ValueError(f"output_len must be >= 2, got {args.output_len}")
    model = resolve_model(args)
    results = []
    for tp, threads in ((1, args.cores), (2, args.cores // 2)):
        log(f"TP={tp}, {threads} thread(s) per rank ...")
        results.append(measure(model, args.dtype, tp, threads, args.batch_size,
                               args.prompt_len, args.output_len))
    rows = [[str(r.tensor_parallel_size), str(r.threads_per_rank),
             f"{r.prefill_tokens_per_s:.1f}", f"{r.decode_tokens_per_s:.1f}",
             f"{r.comm_ms_per_decode_step:.2f}"] for r in results]
    print(format_table(["tp", "threads/rank", "prefill tok/s", "decode tok/s",
                        "comm ms/decode step"], rows))
    write_json(args.json, {"model": str(model), "batch_size": args.batch_size,
                           "prompt_len": args.prompt_len, "output_len": args.output_len,
                           "results": [asdict(r) for r in results]})


if __name__ == "__main__":
    main()
