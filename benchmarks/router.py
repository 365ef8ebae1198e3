"""Router policies on 2 in-process LLMEngine replicas: kv-aware vs round-robin vs least-load.

A closed-loop multi-turn chat workload: every session starts with one of a few shared system
prompts, and each turn's prompt is the previous prompt, its answer and a new user message, so
a replica that served the session (or its system prompt) before holds most of the prompt. Each
replica has a small KV pool (--num-blocks) so placement decides what stays cached. The router
(strand/services/router) sees what a real one would: each engine's KV events and its load.

Reported per policy: prefix hit rate (prompt tokens already cached on the chosen replica when
the request arrived), TTFT p50/p99 and throughput. The replicas step one after the other in
this process, so absolute TTFTs include the other replica's steps; compare policies, not
numbers across machines.

    python -m benchmarks.router                       # default workload, random tiny model
    python -m benchmarks.router --num-sessions 4 --num-turns 2 --output-json out.json
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    add_model_args,
    format_table,
    log,
    percentiles,
    resolve_model,
    set_threads,
    write_json,
)
from strand.engine_core import EngineArgs, LLMEngine, SamplingParams
from strand.engine_core.outputs import RequestOutput
from strand.services.router import ReplicaLoad, Router
from strand.services.router.router import POLICIES


@dataclass(slots=True)
class Session:
    tokens: list[int]  # the conversation so far
    turns_left: int
    rid: str = ""
    submitted: float = 0.0
    replica: int = 0


@dataclass(slots=True)
class PolicyResult:
    policy: str
    prompt_tokens: int = 0
    hit_tokens: int = 0
    output_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    per_replica: list[int] = field(default_factory=lambda: [0, 0])

    def summary(self) -> dict[str, Any]:
        ttft = percentiles(self.ttfts, (50, 99))
        return {"policy": self.policy, "requests": len(self.ttfts),
                "prefix_hit_rate": self.hit_tokens / self.prompt_tokens if self.prompt_tokens
                else 0.0,
                "ttft_p50_ms": ttft["p50"] * 1e3, "ttft_p99_ms": ttft["p99"] * 1e3,
                "output_tokens_per_s": self.output_tokens / self.elapsed_s
                if self.elapsed_s else 0.0,
                "requests_per_replica": self.per_replica}


def make_sessions(args: argparse.Namespace, vocab: int) -> list[Session]:
    rng = random.Random(args.seed)
    systems = [[rng.randrange(vocab) for _ in range(args.system_len)]
               for _ in range(args.num_system_prompts)]
    return [Session(systems[i % len(systems)] + [rng.randrange(vocab)
                                                 for _ in range(args.user_len)], args.num_turns)
            for i in range(args.num_sessions)]


def run_policy(policy: str, args: argparse.Namespace, model_dir: Path) -> PolicyResult:
    engines = [LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), dtype=args.dtype, device="cpu", block_size=args.block_size,
        num_gpu_blocks_override=args.num_blocks, kv_events=True, seed=args.seed))
        for _ in range(2)]
    names = ["replica-0", "replica-1"]
    router = Router(names, args.block_size, policy=policy)
    vocab = engines[0].engine_core.vocab_size
    rng = random.Random(args.seed + 1)
    sessions = make_sessions(args, vocab)
    result = PolicyResult(policy)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    by_rid: dict[str, Session] = {}
    ready = list(sessions)
    seen_first: set[str] = set()
    start = time.perf_counter()
    for step in range(args.max_steps):
        for i, engine in enumerate(engines):
            core = engine.engine_core
            batch = core.take_kv_events()
            if batch is not None:
                router.apply_events(names[i], batch)
            sched = core.scheduler
            router.update_load(names[i], ReplicaLoad(
                len(sched.running), len(sched.waiting),
                sched.kv_cache_manager.block_pool.get_num_free_blocks(), core.num_blocks - 1))
        for s in ready:
            choice = names.index(router.route(s.tokens))
            core = engines[choice].engine_core
            result.hit_tokens += core.lookup_kv_cache(s.tokens)["device"]
            result.prompt_tokens += len(s.tokens)
            result.per_replica[choice] += 1
            s.rid, s.replica, s.submitted = f"{policy}-{step}-{len(by_rid)}", choice, \
                time.perf_counter()
            by_rid[s.rid] = s
            engines[choice].add_request(s.rid, {"prompt_token_ids": list(s.tokens)}, params)
        ready = []
        if not any(e.has_unfinished_requests() for e in engines):
            break
        for engine in engines:
            if not engine.has_unfinished_requests():
                continue
            for out in engine.step():
                assert isinstance(out, RequestOutput)  # a generating engine's
                s = by_rid[out.request_id]
                if out.request_id not in seen_first and out.outputs[0].token_ids:
                    seen_first.add(out.request_id)
                    result.ttfts.append(time.perf_counter() - s.submitted)
                if out.finished:
                    answer = out.outputs[0].token_ids
                    result.output_tokens += len(answer)
                    s.turns_left -= 1
                    if s.turns_left > 0:
                        s.tokens = s.tokens + list(answer) + [rng.randrange(vocab)
                                                              for _ in range(args.user_len)]
                        ready.append(s)
    else:
        raise RuntimeError(f"workload not finished after max_steps={args.max_steps}")
    result.elapsed_s = time.perf_counter() - start
    return result


def add_workload_args(parser: argparse.ArgumentParser, *, num_sessions: int, num_turns: int,
                      system_len: int, num_blocks: int) -> None:
    """The multi-turn chat workload's flags, shared with benchmarks/router_ring.py."""
    add_model_args(parser)
    parser.add_argument("--num-sessions", type=int, default=num_sessions)
    parser.add_argument("--num-turns", type=int, default=num_turns)
    parser.add_argument("--num-system-prompts", type=int, default=2)
    parser.add_argument("--system-len", type=int, default=system_len)
    parser.add_argument("--user-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=num_blocks,
                        help="KV blocks per replica: small, so placement decides what stays")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", type=Path, default=None)


def checked_policies(args: argparse.Namespace, positive: tuple[str, ...]) -> list[str]:
    """The --policies asked for; ValueError naming a count below 1 or an unknown policy."""
    for name in positive:
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"policies must be among {POLICIES}, got {unknown}")
    return policies


def print_policies(summaries: list[dict[str, Any]], count_key: str, count_header: str) -> None:
    rows = [[s["policy"], f"{s['prefix_hit_rate']:.3f}", f"{s['ttft_p50_ms']:.1f}",
             f"{s['ttft_p99_ms']:.1f}", f"{s['output_tokens_per_s']:.1f}",
             str(s[count_key])] for s in summaries]
    print(format_table(["policy", "hit rate", "TTFT p50 ms", "TTFT p99 ms", "out tok/s",
                        count_header], rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(parser, num_sessions=16, num_turns=4, system_len=128, num_blocks=96)
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--num-threads", type=int, default=None)
    args = parser.parse_args(argv)
    policies = checked_policies(args, ("num_sessions", "num_turns", "num_system_prompts",
                                       "output_len", "block_size"))
    threads = set_threads(args.num_threads)
    model_dir = resolve_model(args)
    summaries = []
    for policy in policies:
        log(f"policy {policy}")
        summaries.append(run_policy(policy, args, model_dir).summary())
    print_policies(summaries, "requests_per_replica", "per replica")
    write_json(args.output_json, {"benchmark": "router", "threads": threads,
                                  "config": {k: v for k, v in vars(args).items()
                                             if k not in ("output_json", "model_cache_dir")},
                                  "results": summaries})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
