"""Builders for scheduler tests: a scheduler, requests, and a deterministic fake model runner.

The fake runner keeps a fake paged KV cache: each slot holds a rolling hash of the token prefix
up to its position. Before "attending" it checks every context slot against the request's own
tokens, so a wrong prefix hit, a block handed to two requests, or a stale block fails loudly.
The sampled token is a function of that rolling hash, i.e. of the token history only: outputs
must be identical with or without preemption, prefix hits or cache resets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from strand.engine_core.config import CacheConfig, SchedulerConfig
from strand.engine_core.core.engine_io import EngineCoreOutput
from strand.engine_core.core.request import Request
from strand.engine_core.core.runner_output import LogprobsLists, ModelRunnerOutput
from strand.engine_core.core.sched_output import SchedulerOutput
from strand.engine_core.core.scheduler import Scheduler
from strand.engine_core.sampling_params import SamplingParams

VOCAB_SIZE = 1000
_MOD = (1 << 61) - 1


def roll(state: int, token: int) -> int:
    return (state * 1_000_003 + token + 1) % _MOD


def token_after(state: int) -> int:
    return (state * 2_654_435_761 >> 13) % VOCAB_SIZE


def expected_tokens(prompt: list[int], num_tokens: int) -> list[int]:
    """What the fake model generates after prompt, computed without any cache."""
    state = 0
    for t in prompt:
        state = roll(state, t)
    out = []
    for _ in range(num_tokens):
        tok = token_after(state)
        out.append(tok)
        state = roll(state, tok)
    return out


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_num_batched_tokens: int = 64,
                   max_num_seqs: int = 16, max_model_len: int = 128, policy: str = "fcfs",
                   enable_prefix_caching: bool = True, long_prefill_token_threshold: int = 0,
                   hash_algo: str = "sha256", connector: object | None = None) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                        max_model_len=max_model_len,
                        long_prefill_token_threshold=long_prefill_token_threshold,
                        policy=policy),
        CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching,
                    prefix_caching_hash_algo=hash_algo),
        num_blocks, connector=connector)


_arrival = [0.0]


def make_request(req_id: str, prompt: list[int] | int, max_tokens: int | None = 4,
                 priority: int = 0, cache_salt: str | None = None, eos_token_id: int | None = None,
                 arrival_time: float | None = None, **params: object) -> Request:
    """prompt: token ids, or a length (tokens derived from req_id so prompts differ)."""
    if isinstance(prompt, int):
        base = sum(map(ord, req_id)) * 7
        prompt = [(base + i * 13) % VOCAB_SIZE for i in range(prompt)]
    if arrival_time is None:  # strictly increasing: FCFS ties never depend on the clock
        _arrival[0] += 1.0
        arrival_time = _arrival[0]
    return Request(req_id, list(prompt), SamplingParams(max_tokens=max_tokens, **params),  # type: ignore[arg-type]
                   eos_token_id=eos_token_id, arrival_time=arrival_time, priority=priority,
                   cache_salt=cache_salt)


@dataclass(slots=True)
class _RunnerRequest:
    tokens: list[int]
    block_ids: list[int]
    num_computed: int
    params: SamplingParams
    num_prompt: int


class FakeRunner:
    """Mirrors a model runner's request state from SchedulerOutput diffs and checks them."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.block_size = scheduler.block_size
        num_blocks = scheduler.kv_cache_manager.num_blocks
        self.kv: list[list[int | None]] = [[None] * self.block_size for _ in range(num_blocks)]
        self.reqs: dict[str, _RunnerRequest] = {}

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        # The runner drops finished and preempted requests before adding new ones.
        for rid in out.finished_req_ids | out.preempted_req_ids:
            self.reqs.pop(rid, None)
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.reqs, f"{new.req_id} sent as new twice"
            self.reqs[new.req_id] = _RunnerRequest(
                list(new.prompt_token_ids) + list(new.output_token_ids), list(new.block_ids),
                new.num_computed_tokens, new.sampling_params, len(new.prompt_token_ids))
        cached = out.scheduled_cached_reqs
        for rid, new_ids, num_computed in zip(cached.req_ids, cached.new_block_ids,
                                              cached.num_computed_tokens, strict=True):
            r = self.reqs[rid]
            assert r.num_computed == num_computed, f"{rid}: runner/scheduler disagree"
            r.block_ids.extend(new_ids)
        assert out.total_num_scheduled_tokens == sum(out.num_scheduled_tokens.values())
        req_ids = list(out.num_scheduled_tokens)
        bs = self.block_size
        # Pass 1 writes this step's KV for every request, pass 2 attends: like a real backend,
        # where each layer writes all new K/V before attention.
        states: dict[str, int] = {}
        for rid in req_ids:
            r = self.reqs[rid]
            n = out.num_scheduled_tokens[rid]
            end = r.num_computed + n
            assert n > 0 and end <= len(r.tokens), f"{rid}: scheduled past its tokens"
            assert len(r.block_ids) * bs >= end, f"{rid}: too few blocks"
            assert 0 not in r.block_ids, f"{rid}: reserved block 0 handed out"
            state = 0
            for p in range(end):
                state = roll(state, r.tokens[p])
                if p >= r.num_computed:
                    self.kv[r.block_ids[p // bs]][p % bs] = state
            states[rid] = state
        sampled: list[list[int]] = []
        prompt_logprobs: dict[str, LogprobsLists | None] = {}
        for rid in req_ids:
            r = self.reqs[rid]
            end = r.num_computed + out.num_scheduled_tokens[rid]
            state = 0
            for p in range(end):
                state = roll(state, r.tokens[p])
                assert self.kv[r.block_ids[p // bs]][p % bs] == state, \
                    f"{rid}: wrong KV at position {p}"
            if r.params.prompt_logprobs is not None and r.num_computed < r.num_prompt:
                rows = list(range(r.num_computed, min(end, r.num_prompt)))
                prompt_logprobs[rid] = LogprobsLists([[r.tokens[p]] for p in rows],
                                                     [[-1.0] for _ in rows], [1 for _ in rows])
            r.num_computed = end
            if end == len(r.tokens):
                tok = token_after(states[rid])
                r.tokens.append(tok)
                sampled.append([tok])
            else:
                sampled.append([])
        logprobs = None
        if any(self.reqs[rid].params.logprobs is not None for rid in req_ids):
            logprobs = LogprobsLists([[s[0] if s else 0] for s in sampled],
                                     [[-0.5] for _ in sampled], [1 for _ in sampled])
        return ModelRunnerOutput(req_ids, {rid: i for i, rid in enumerate(req_ids)}, sampled,
                                 logprobs=logprobs, prompt_logprobs_dict=prompt_logprobs)


@dataclass(slots=True)
class RunResult:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finish_reasons: dict[str, str] = field(default_factory=dict)
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    num_steps: int = 0

    def collect(self, outputs: Iterable[EngineCoreOutput]) -> None:
        for o in outputs:
            self.outputs.append(o)
            self.tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finish_reason is not None:
                self.finish_reasons[o.request_id] = o.finish_reason


def step(scheduler: Scheduler, runner: FakeRunner,
         result: RunResult | None = None) -> tuple[SchedulerOutput, list[EngineCoreOutput]]:
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, runner.execute(out))
    if result is not None:
        result.collect(outputs)
        result.num_steps += 1
    return out, outputs


def run_to_completion(scheduler: Scheduler, runner: FakeRunner | None = None,
                      max_steps: int = 1000, result: RunResult | None = None) -> RunResult:
    runner = runner or FakeRunner(scheduler)
    result = result or RunResult()
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return result
        step(scheduler, runner, result)
        check_invariants(scheduler)
    raise AssertionError(f"not finished after {max_steps} steps")


def check_invariants(scheduler: Scheduler) -> None:
    """Ref counts match the block tables; no block is both free and held."""
    kv = scheduler.kv_cache_manager
    pool = kv.block_pool
    holders = [0] * pool.num_blocks
    for blocks in kv.req_to_blocks.values():
        for b in blocks:
            holders[b.block_id] += 1
    free = pool.free_block_queue.get_all_free_blocks()
    free_ids = {b.block_id for b in free}
    assert len(free_ids) == len(free) == pool.get_num_free_blocks()
    assert 0 not in free_ids
    for b in pool.blocks[1:]:
        assert b.ref_cnt >= 0
        assert b.ref_cnt == holders[b.block_id], f"block {b.block_id}: ref_cnt != holders"
        assert (b.block_id in free_ids) == (b.ref_cnt == 0), f"block {b.block_id} free and held"
    for h, b in pool.cached_block_hash_to_block.items():
        assert b.block_hash == h
    # Only running requests hold blocks.
    assert set(kv.req_to_blocks) == {r.request_id for r in scheduler.running}


def assert_pool_whole(scheduler: Scheduler) -> None:
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1
    assert not scheduler.kv_cache_manager.req_to_blocks
