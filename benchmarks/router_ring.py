"""Router policies on a real ring: `strand serve --data-parallel-size 2 --router-policy P`.

The workload of benchmarks/router.py (closed-loop multi-turn sessions sharing a few system
prompts, small KV pools per replica), but every session is a client thread streaming Generate
calls through one gateway of an auto-step stack, and the tokenizer's router places each
request from the engines' KV events and loads, as in production. One fresh stack per policy.

Reported per policy: prefix hit rate (the engines' own counts: prompt tokens found cached over
prompt tokens looked up, from GetLoads), TTFT p50/p99 as the client sees it, output tokens/s,
and prompt tokens per replica.

    python -m benchmarks.router_ring                    # default workload, random tiny model
    python -m benchmarks.router_ring --num-sessions 4 --num-turns 2 --output-json out.json
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from pathlib import Path

import grpc

from benchmarks.common import log, resolve_model, write_json
from benchmarks.router import (
    PolicyResult,
    Session,
    add_workload_args,
    checked_policies,
    make_sessions,
    print_policies,
)
from strand.engine_core import SamplingParams
from strand.engine_core.sampling_params import RequestOutputKind
from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services._proto.strand.v1 import control_pb2_grpc
from strand.services.client import EngineClient
from strand.services.launch import StackConfig, launch_stack


def _session(address: str, session: Session, args: argparse.Namespace, vocab: int,
             result: PolicyResult, lock: threading.Lock) -> None:
    rng = random.Random(args.seed + len(session.tokens))
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True,
                            output_kind=RequestOutputKind.CUMULATIVE)
    with EngineClient(address, timeout=300) as client:
        while session.turns_left > 0:
            start = time.perf_counter()
            ttft = None
            answer: list[int] = []
            for out in client.generate({"prompt_token_ids": list(session.tokens)}, params):
                if ttft is None and out.outputs and out.outputs[0].token_ids:
                    ttft = time.perf_counter() - start
                answer = list(out.outputs[0].token_ids) if out.outputs else answer
            with lock:
                result.ttfts.append(ttft if ttft is not None else time.perf_counter() - start)
                result.output_tokens += len(answer)
            session.turns_left -= 1
            session.tokens = session.tokens + answer + [rng.randrange(vocab)
                                                        for _ in range(args.user_len)]


def run_policy(policy: str, args: argparse.Namespace, model_dir: Path, vocab: int
               ) -> PolicyResult:
    engine_args = ["--device", args.device, "--dtype", args.dtype,
                   "--block-size", str(args.block_size),
                   "--num-gpu-blocks-override", str(args.num_blocks)]
    with tempfile.TemporaryDirectory(prefix="strand-router-ring-") as logs:
        config = StackConfig(model=str(model_dir), engine_args=engine_args,
                             gateway_args=["--auto-step"], log_dir=Path(logs),
                             data_parallel_size=2, router_policy=policy)
        with launch_stack(config) as stack:
            result = PolicyResult(policy)
            lock = threading.Lock()
            threads = [threading.Thread(target=_session, args=(stack.gateway_address, s, args,
                                                               vocab, result, lock))
                       for s in make_sessions(args, vocab)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            result.elapsed_s = time.perf_counter() - start
            with grpc.insecure_channel(stack.gateway_address) as channel:
                loads = control_pb2_grpc.ControlStub(channel).GetLoads(cpb.GetLoadsRequest(),
                                                                       timeout=30).loads
    result.prompt_tokens = sum(int(load.prefix_cache_queries) for load in loads)
    result.hit_tokens = sum(int(load.prefix_cache_hits) for load in loads)
    result.per_replica = sorted(int(load.prefix_cache_queries) for load in loads)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(parser, num_sessions=8, num_turns=3, system_len=64, num_blocks=48)
    args = parser.parse_args(argv)
    policies = checked_policies(args, ("num_sessions", "num_turns", "num_system_prompts",
                                       "output_len", "block_size", "num_blocks"))
    model_dir = resolve_model(args)
    from strand.engine_core.model_executor.model_config import load_model_config

    vocab = load_model_config(str(model_dir), args.dtype).vocab_size
    summaries = []
    for policy in policies:
        log(f"policy {policy}: a fresh 2-replica stack")
        summary = run_policy(policy, args, model_dir, vocab).summary()
        summary["prompt_tokens_per_replica"] = summary.pop("requests_per_replica")
        summaries.append(summary)
    print_policies(summaries, "prompt_tokens_per_replica", "prompt tokens per replica")
    write_json(args.output_json, {"benchmark": "router_ring",
                                  "config": {k: v for k, v in vars(args).items()
                                             if k not in ("output_json", "model_cache_dir")},
                                  "results": summaries})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
