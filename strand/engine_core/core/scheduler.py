"""Scheduler: continuous batching over num_computed_tokens, with preemption by recompute.

schedule() decides what runs this step; update_from_output() applies what the runner produced.
There are no prefill/decode phases: each step moves every scheduled request toward its token
count, running requests first, then waiting ones, within max_num_batched_tokens and max_num_seqs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from strand.engine_core.config import CacheConfig, SchedulerConfig
from strand.engine_core.connector.base import KVConnectorBase
from strand.engine_core.core.engine_io import EngineCoreOutput
from strand.engine_core.core.kv_cache_manager import KVCacheManager
from strand.engine_core.core.kv_cache_utils import KVCacheBlock, get_hash_fn, update_block_hashes
from strand.engine_core.core.request import Request, RequestStatus
from strand.engine_core.core.request_queue import make_request_queue
from strand.engine_core.core.runner_output import ModelRunnerOutput
from strand.engine_core.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from strand.engine_core.core.stats import PrefixCacheStats, SchedulerStats
from strand.engine_core.core.step_plan import RunningPlan, leading_rows, logprobs_row
from strand.engine_core.core.stop import check_stop
from strand.engine_core.core.tier_reset import TierReset, connector_tiers
from strand.engine_core.errors import DuplicateRequestError
from strand.engine_core.pooler_config import PoolerConfig
from strand.engine_core.spec_decode.config import drafts_allowed
from strand.engine_core.spec_decode.ngram import NgramProposer
from strand.engine_core.spec_decode.stats import SpecDecodingStats

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 num_blocks: int, connector: object | None = None) -> None:
        if scheduler_config.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1, got "
                             f"{scheduler_config.max_num_batched_tokens}")
        if scheduler_config.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {scheduler_config.max_num_seqs}")
        if scheduler_config.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0, got "
                             f"{scheduler_config.long_prefill_token_threshold}")
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.pooler = scheduler_config.pooler
        self.connector = connector
        # Only a full connector takes part in loading and saving; any object with reset_cache()
        # may still be reset.
        self.kv_connector = connector if isinstance(connector, KVConnectorBase) else None
        # Tokens the connector supplied on a device prefix-cache miss (external hits).
        self.connector_prefix_cache_stats = PrefixCacheStats()
        self.block_size = cache_config.block_size
        self.max_model_len = scheduler_config.max_model_len
        self.enable_caching = cache_config.enable_prefix_caching
        self.hash_fn = get_hash_fn(cache_config.prefix_caching_hash_algo)
        self.kv_cache_manager = KVCacheManager(num_blocks, self.block_size, self.enable_caching)
        # Block hashes key the device prefix cache and the connector's tier alike: a connector
        # needs them even with automatic prefix caching off (vLLM hashes for either).
        self.hash_blocks = self.enable_caching or self.kv_connector is not None
        self.policy = scheduler_config.policy
        self.waiting = make_request_queue(self.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # unfinished only
        # Finished or aborted since the last schedule(): the runner drops their state.
        self.finished_req_ids: set[str] = set()
        # Preempted outside schedule() (reset_prefix_cache): reported by the next schedule().
        self._preempted_outside_step: set[str] = set()
        self.num_preemptions = 0
        speculative = scheduler_config.speculative
        self.proposer = NgramProposer(speculative) if speculative is not None else None
        self.spec_stats = SpecDecodingStats()

    # ---- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a request; ValueError (and no change) if it could never run to its end."""
        if request.request_id in self.requests:
            raise DuplicateRequestError(f"request_id {request.request_id!r} already exists")
        num_prompt = request.num_prompt_tokens
        if num_prompt < 1:
            raise ValueError("prompt_token_ids must not be empty")
        if request.pooling_params is not None:
            if num_prompt > self.max_model_len:
                raise ValueError(f"prompt length ({num_prompt}) must be <= max_model_len "
                                 f"({self.max_model_len})")
            # An embedding computes its prompt alone; its carrier's one "token" needs no slot.
            max_tokens = 1
            request.pools_every_position = bool(self.pooler and self.pooler.needs_every_row)
            request.pooling_params.resolve(self.pooler or PoolerConfig())
        elif num_prompt + 1 > self.max_model_len:
            raise ValueError(f"prompt length ({num_prompt}) + 1 generated token must be <= "
                             f"max_model_len ({self.max_model_len})")
        else:
            room = self.max_model_len - num_prompt
            asked = request.sampling_params.max_tokens
            max_tokens = room if asked is None else min(asked, room)
        # The last token is sampled but never fed back, so its KV needs no slot.
        num_blocks_needed = -(-(num_prompt + max_tokens - 1) // self.block_size)
        num_allocatable = self.kv_cache_manager.num_blocks - 1
        if num_blocks_needed > num_allocatable:
            raise ValueError(
                f"prompt ({num_prompt}) + max_tokens ({max_tokens}) needs {num_blocks_needed} KV "
                f"cache blocks of {self.block_size} tokens, more than the pool's "
                f"num_blocks - 1 ({num_allocatable})")
        request.max_tokens = max_tokens
        request.drafts_allowed = self.proposer is not None and drafts_allowed(
            request.sampling_params)
        if self.hash_blocks:
            update_block_hashes(request, self.block_size, self.hash_fn)
        self.waiting.add(request)
        self.requests[request.request_id] = request

    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> None:
        """End requests from outside (abort, stop string); unknown or finished ids are ignored."""
        if not RequestStatus.is_finished(status):
            raise ValueError(f"status must be a finished status, got {status.name}")
        ids = (request_ids,) if isinstance(request_ids, str) else request_ids
        running_done: set[Request] = set()
        for req_id in ids:
            request = self.requests.get(req_id)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                running_done.add(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)
        if running_done:
            self.running = [r for r in self.running if r not in running_done]

    def _free_request(self, request: Request) -> None:
        self._offer_to_connector(request)
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)
        if self.proposer is not None:
            self.proposer.drop(request.request_id)

    def _offer_to_connector(self, request: Request) -> None:
        """Let the connector save the computed blocks a request is about to free."""
        if self.kv_connector is not None and request.num_computed_tokens > 0:
            block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
            if block_ids:
                self.kv_connector.request_finished(request, block_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def has_finished_requests(self) -> bool:
        """Finished or aborted ids the runner has not been told about yet."""
        return bool(self.finished_req_ids)

    def has_requests(self) -> bool:
        """Anything for a step to do: requests to run, or finished ids for the runner to drop
        (vLLM steps for those too, so the runner frees their state at once)."""
        return bool(self.requests) or bool(self.finished_req_ids)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def decodes_only(self) -> bool:
        """Whether the next step, as things stand, admits nothing and computes one token per
        running request: nothing waits, and every running request has its prompt computed."""
        return len(self.waiting) == 0 and all(
            r.num_computed_tokens >= r.num_prompt_tokens for r in self.running)

    # ---- one step: decide ----------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Decide this step: running requests first (preempting when blocks run out), then
        waiting ones while budget remains; then describe the decision for the runner."""
        threshold = self.scheduler_config.long_prefill_token_threshold
        plan = RunningPlan(self.scheduler_config.max_num_batched_tokens)
        plan.may_draft = self._may_draft()
        self._schedule_running(plan, threshold)
        scheduled_new: list[Request] = []
        # After a preemption the pool is tight: admitting would only preempt again.
        if not plan.preempted:
            self._schedule_waiting(plan.budget, threshold, plan.num_scheduled, scheduled_new)
        output = self._make_output(plan, scheduled_new)
        # vLLM v1 style: the scheduler advances num_computed_tokens when it decides (after the
        # output above recorded where each request stood).
        requests = self.requests
        for req_id, n in plan.num_scheduled.items():
            requests[req_id].num_computed_tokens += n
        return output

    def _schedule_running(self, plan: RunningPlan, threshold: int) -> None:
        running = self.running
        i = 0
        while i < len(running) and plan.budget > 0:
            request = running[i]
            num_new = request.num_tokens - request.num_computed_tokens
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, plan.budget)
            if num_new <= 0:
                i += 1
                continue
            drafts = (self._drafts(request, plan.budget)
                      if num_new == 1 and plan.may_draft else None)
            if drafts:
                num_new += len(drafts)
            new_blocks, i = self._allocate_or_preempt(request, num_new, plan, i)
            if new_blocks is None:
                continue  # the request preempted itself; running[i] is now the next one
            if drafts:
                plan.drafts[request.request_id] = drafts
            plan.scheduled_running.append(request)
            plan.num_scheduled[request.request_id] = num_new
            plan.new_blocks_of[request.request_id] = new_blocks
            plan.budget -= num_new
            i += 1

    def _may_draft(self) -> bool:
        """Speculative decoding is on, and the batch is not past disable_by_batch_size."""
        speculative = self.scheduler_config.speculative
        if speculative is None:
            return False
        limit = speculative.disable_by_batch_size
        return limit is None or len(self.running) <= limit

    def _drafts(self, request: Request, budget: int) -> list[int] | None:
        """Tokens to verify after request's last one this step (None: it takes one token).

        Capped so the step cannot produce more than max_tokens (which also keeps the drafts'
        KV inside the blocks add_request counted) nor spend more than the token budget.
        """
        if not request.drafts_allowed or self.proposer is None:
            return None
        room = min(request.max_tokens - request.num_output_tokens - 1, budget - 1)
        return self.proposer.propose(request.request_id, request.all_token_ids, room) or None

    def _allocate_or_preempt(self, request: Request, num_new: int, plan: RunningPlan, i: int
                             ) -> tuple[list[KVCacheBlock] | None, int]:
        """Blocks for request's next num_new tokens, preempting victims until they fit (None
        when request itself was the victim); i, request's index, moves with removals."""
        running = self.running
        while True:
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new)
            if new_blocks is not None:
                return new_blocks, i
            victim = self._pick_victim()
            victim_index = running.index(victim)
            del running[victim_index]
            if victim_index < i:  # priority: the victim may already be scheduled
                i -= 1
                plan.unschedule(victim)
            self._preempt(victim)
            plan.preempted.append(victim)
            if victim is request:
                return None, i

    def _make_output(self, plan: RunningPlan, scheduled_new: list[Request]) -> SchedulerOutput:
        kv = self.kv_cache_manager
        new_reqs = [NewRequestData(
            req_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=list(request.output_token_ids),
            sampling_params=request.sampling_params,
            block_ids=kv.get_block_ids(request.request_id),
            num_computed_tokens=request.num_computed_tokens,
            eos_token_id=request.eos_token_id,
            lora_request=request.lora_request,
        ) for request in scheduled_new]
        running = plan.scheduled_running
        cached = CachedRequestData(
            req_ids=[r.request_id for r in running],
            new_block_ids=[[b.block_id for b in plan.new_blocks_of[r.request_id]]
                           for r in running],
            num_computed_tokens=[r.num_computed_tokens for r in running],
        )
        preempted_ids = {r.request_id for r in plan.preempted}
        if self._preempted_outside_step:
            preempted_ids |= self._preempted_outside_step
            self._preempted_outside_step = set()
        finished = self.finished_req_ids
        self.finished_req_ids = set()
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=plan.num_scheduled,
            total_num_scheduled_tokens=sum(plan.num_scheduled.values()),
            finished_req_ids=finished,
            preempted_req_ids=preempted_ids,
            kv_connector_metadata=(self.kv_connector.build_connector_meta()
                                   if self.kv_connector is not None else None),
            scheduled_spec_decode_tokens=plan.drafts,
        )

    def _schedule_waiting(self, budget: int, threshold: int, num_scheduled: dict[str, int],
                          scheduled_new: list[Request]) -> None:
        kv = self.kv_cache_manager
        max_num_seqs = self.scheduler_config.max_num_seqs
        waiting = self.waiting
        now = time.time()
        max_loras = self.scheduler_config.max_loras
        loras = {r.lora_request.lora_int_id for r in self.running if r.lora_request}
        skipped: list[Request] = []  # adapter-bound: they wait, later requests may go ahead
        while waiting and budget > 0 and len(self.running) < max_num_seqs:
            request = waiting.peek()
            lora = request.lora_request
            if lora is not None and max_loras is not None and lora.lora_int_id not in loras \
                    and len(loras) >= max_loras:
                skipped.append(waiting.pop())  # a batch holds at most max_loras adapters
                continue
            hits, num_hit_tokens = kv.get_computed_blocks(request)
            num_external = self._get_num_external_tokens(request, num_hit_tokens)
            num_loaded = num_external or 0
            num_new = request.num_tokens - num_hit_tokens - num_loaded
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            # External tokens need blocks but no compute: they come out of no token budget.
            if kv.allocate_slots(request, num_loaded + num_new, hits) is None:
                break  # head-of-line: later requests wait too, so order is kept
            waiting.pop()
            if self.kv_connector is not None and num_external is not None:
                # Queried: what the device cache did not have (vLLM's connector stats).
                self.connector_prefix_cache_stats.record(
                    request.num_tokens - num_hit_tokens, num_loaded, request.num_preemptions > 0)
                self.kv_connector.update_state_after_alloc(
                    request, kv.get_block_ids(request.request_id), num_hit_tokens, num_loaded)
            num_hit_tokens += num_loaded
            if request.status == RequestStatus.WAITING:
                request.num_cached_tokens = num_hit_tokens
                request.first_scheduled_time = now
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit_tokens
            self.running.append(request)
            scheduled_new.append(request)
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            if lora is not None:
                loras.add(lora.lora_int_id)
        for request in reversed(skipped):  # back at the head, in their order
            waiting.add_preempted(request)

    def _get_num_external_tokens(self, request: Request, num_hit_tokens: int) -> int | None:
        """Leading tokens after the device hit that the connector supplies; None when it was
        not asked (no connector, or prompt logprobs or pooling: every position is needed).

        Asked with prefix caching off too (the device hit is then 0). The answer is taken in
        tokens, as the connector gives it (it may load a partial block); only capped so the
        last token is still computed.
        """
        if self.kv_connector is None or request.skips_cached_prefix:
            return None
        num = self.kv_connector.get_num_new_matched_tokens(request, num_hit_tokens)
        return max(0, min(num, request.num_tokens - 1 - num_hit_tokens))

    def _pick_victim(self) -> Request:
        """FCFS: the newest running request; priority: the worst (highest value, latest)."""
        if self.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, request: Request, offer_to_connector: bool = True) -> None:
        """Free its blocks and requeue it at the head; its KV is recomputed when it resumes
        (or reloaded, when a connector saved it)."""
        if offer_to_connector:
            self._offer_to_connector(request)
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.unreported_preemptions.append(time.time())
        self.num_preemptions += 1
        self.waiting.add_preempted(request)

    # ---- one step: apply -----------------------------------------------------------------

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Append sampled tokens, finish what stopped, free its blocks; one output per request
        that got tokens, prompt logprobs or finished."""
        outputs: list[EngineCoreOutput] = []
        index_of = runner_output.req_id_to_index
        sampled = runner_output.sampled_token_ids
        prompt_logprobs = runner_output.prompt_logprobs_dict
        pooler_output = runner_output.pooler_output
        requests = self.requests
        preempted_status = RequestStatus.PREEMPTED
        stopped: set[Request] = set()
        stopped_preempted: list[Request] = []
        drafts_of = scheduler_output.scheduled_spec_decode_tokens
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(req_id)
            # Aborted since schedule(): its result is dropped. A request preempted while this
            # step computed (vLLM's test_preempt_during_execution) still takes the token the
            # step sampled: it is recomputed with it when it resumes, nothing is lost.
            if request is None:
                continue
            was_preempted = request.status == preempted_status
            index = index_of.get(req_id)
            new_token_ids = sampled[index] if index is not None else []
            if drafts_of and req_id in drafts_of:
                self._settle_drafts(request, len(drafts_of[req_id]), len(new_token_ids),
                                    was_preempted)
            finished = False
            pooled = pooler_output.get(req_id) if pooler_output else None
            embedding: list[float] | None = None
            if new_token_ids:
                new_token_ids, finished = self._append_tokens(request, new_token_ids)
            elif pooled is not None:
                request.status = RequestStatus.FINISHED_STOPPED
                finished = True
                if request.pooling_params is not None:  # an embedding or label probabilities
                    embedding = request.pooling_params.finish(
                        pooled, self.pooler.activation if self.pooler else "softmax").tolist()
            new_prompt_logprobs = prompt_logprobs.get(req_id) if prompt_logprobs else None
            if not (new_token_ids or finished or new_prompt_logprobs):
                continue
            new_logprobs = None
            if new_token_ids and request.sampling_params.logprobs is not None:
                several = runner_output.draft_logprobs.get(req_id)
                new_logprobs = (logprobs_row(runner_output.logprobs, index) if several is None
                                else leading_rows(several, len(new_token_ids)))
            # Positional: this runs once per request per step.
            outputs.append(EngineCoreOutput(
                req_id, new_token_ids, new_logprobs, new_prompt_logprobs,
                request.get_finish_reason() if finished else None, request.stop_reason,
                request.num_cached_tokens if request.num_cached_tokens > 0 else 0,
                request.take_first_scheduled_time(), request.take_preemption_times(),
                pooling_output=embedding))
            if finished:
                if was_preempted:
                    stopped_preempted.append(request)
                else:
                    stopped.add(request)
                self._free_request(request)
        if stopped:
            self.running = [r for r in self.running if r not in stopped]
        for request in stopped_preempted:
            self.waiting.remove(request)
        return outputs

    def _settle_drafts(self, request: Request, num_drafts: int, num_sampled: int,
                       was_preempted: bool) -> None:
        """Count a verified draft, and take the rejected drafts back out of the computed tokens
        (their KV slots stay allocated; the next tokens overwrite them). Before any token is
        appended or the request freed, so both see what the cache really holds."""
        if num_sampled == 0:
            return  # a tensor-parallel worker's empty result: nothing was verified here
        num_accepted = num_sampled - 1
        self.spec_stats.observe(num_drafts, num_accepted)
        if not was_preempted:  # a preempted request restarts from 0 anyway
            request.num_computed_tokens -= num_drafts - num_accepted

    def _append_tokens(self, request: Request, new_token_ids: list[int]
                       ) -> tuple[list[int], bool]:
        """Append sampled tokens up to the first that stops the request; (kept, finished)."""
        output_ids = request.output_token_ids
        all_ids = request.all_token_ids
        finished = False
        for n, token_id in enumerate(new_token_ids, 1):
            output_ids.append(token_id)
            all_ids.append(token_id)
            if check_stop(request, self.max_model_len):
                finished = True
                new_token_ids = new_token_ids[:n]
                break
        if self.hash_blocks and len(all_ids) // self.block_size > len(request.block_hashes):
            update_block_hashes(request, self.block_size, self.hash_fn)
        return new_token_ids, finished

    # ---- cache control and stats ---------------------------------------------------------

    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool:
        """Forget every cached prefix. False (logged) while requests hold blocks, unless
        reset_running_requests, which preempts them first (they are recomputed, same output)."""
        return all(t.reset for t in self.reset_prefix_cache_tiers(reset_running_requests,
                                                                   reset_connector))

    def reset_prefix_cache_tiers(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> list[TierReset]:
        """reset_prefix_cache, reporting what each tier dropped: the device cache first, then
        (reset_connector) each connector tier."""
        if reset_running_requests and self.running:
            # Newest first, each to the head: the oldest ends up first in line again. Their
            # blocks are not offered to a connector that is about to be emptied anyway.
            offer = not (reset_connector and self.connector is not None)
            for request in reversed(self.running):
                self._preempt(request, offer_to_connector=offer)
                self._preempted_outside_step.add(request.request_id)
            self.running = []
        num_cached = len(self.kv_cache_manager.block_pool.cached_block_hash_to_block.items())
        ok = self.kv_cache_manager.reset_prefix_cache()
        if ok:
            self.connector_prefix_cache_stats = PrefixCacheStats()
        tiers = [TierReset("device", ok, num_cached if ok else 0)]
        if reset_connector and self.connector is not None:
            connector = connector_tiers(self.connector)
            if not all(t.reset for t in connector):
                logger.warning("Failed to reset the KV connector's cache")
            tiers += connector
        return tiers

    def make_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=kv.usage,
            prefix_cache_stats=kv.make_prefix_cache_stats(),
            prefix_cache_recent_hit_rate=kv.caching_metrics.hit_rate,
            num_preemptions=self.num_preemptions,
            prefix_cache_totals=kv.prefix_cache_totals.copy(),
            connector_prefix_cache_stats=(self.connector_prefix_cache_stats.copy()
                                          if self.kv_connector is not None else None),
            spec_decoding=self.spec_stats.copy() if self.proposer is not None else None,
        )

