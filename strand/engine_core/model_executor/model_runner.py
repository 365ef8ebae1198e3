"""ModelRunner: one forward over every token the scheduler picked this step, then sampling.

Life of a step (execute_model):
 1. apply the SchedulerOutput to the runner's copies of the requests (new, cached, finished,
    preempted);
 2. cut input ids, positions and slot mapping for all scheduled tokens out of the host arrays;
 3. one forward: K/V land in the paged cache, attention through the backend (on CUDA, a pure
    decode step replays a captured graph instead: decode_graphs.py);
 4. logits only at the rows that are sampled (requests that reached their last known token) and
    at prompt positions whose logprobs were asked for;
 5. sample, append each sampled token to the runner's copy of the request, return the tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from strand.engine_core.config import CacheConfig, LoRAConfig, SchedulerConfig
from strand.engine_core.connector.base import KVConnectorBase
from strand.engine_core.connector.cpu_tier import CPUBlockTier
from strand.engine_core.core.runner_output import LogprobsLists, ModelRunnerOutput
from strand.engine_core.core.sched_output import SchedulerOutput
from strand.engine_core.distributed.layers import local_config, shard_layout
from strand.engine_core.distributed.parallel_state import TPGroup
from strand.engine_core.lora.manager import LoRAManager
from strand.engine_core.lora.sharding import LoRAShard
from strand.engine_core.model_executor.attention.backend import AttentionMetadata
from strand.engine_core.model_executor.attention.describe import describe_attention
from strand.engine_core.model_executor.attention.metadata_builder import build_attention_metadata
from strand.engine_core.model_executor.attention.selector import get_attention_backend
from strand.engine_core.model_executor.cpu_allocator import tune_cpu_allocator
from strand.engine_core.model_executor.cuda_graphs import GraphCapturer
from strand.engine_core.model_executor.decode_graphs import DecodeGraphRunner
from strand.engine_core.model_executor.input_batch import CachedRequestState, InputBatch
from strand.engine_core.model_executor.kv_cache_setup import KVCacheSetup
from strand.engine_core.model_executor.kv_cache_sizing import with_cache_dtype
from strand.engine_core.model_executor.layers.cpu_weights import prepare_cpu_weights
from strand.engine_core.model_executor.loader import load_model, resolve_device
from strand.engine_core.model_executor.model_config import ModelConfig
from strand.engine_core.model_executor.runner_helpers import check_schedule, spread_logprobs
from strand.engine_core.model_executor.sampler import Sampler, SamplerOutput, argmax_tokens
from strand.engine_core.model_executor.sampling.logprobs import compute_prompt_logprobs
from strand.engine_core.model_executor.sampling_metadata import (
    SamplingRow,
    argmax_only,
    build_sampling_metadata,
    make_generator,
)
from strand.engine_core.pooling.pooler import Pooler, PoolRows
from strand.engine_core.spec_decode.verify import DraftRows, emitted_logprobs, verify_drafts
from strand.engine_core.structured_output.runner_grammars import RunnerGrammars
from strand.kernels import cpu_linear_panels
from strand.kernels._cpu_build import ensure_built as ensure_cpu_kernels_built
from strand.platform.cpu_isa import probe as probe_cpu_isa

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StepInputs:
    """Everything one forward needs, built on the host then moved once."""

    req_ids: list[str]  # the scheduler's order
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    metadata: AttentionMetadata
    sample_reqs: np.ndarray  # [num_sampled] indices into req_ids of requests sampled this step
    # [num_sampled + num_prompt_rows] hidden rows whose logits are computed: sampled rows first.
    logits_indices: torch.Tensor
    # req index -> (first prompt position, number of positions) whose logprobs are computed now.
    prompt_spans: dict[int, tuple[int, int]]
    # Batch size of the decode graph that runs this step (input_ids, positions and metadata are
    # then its static buffers, padded to it); None: an eager forward.
    graph_size: int | None = None
    # req index -> the draft tokens verified this step, and where each sampled request's logits
    # rows are (a drafted one has len + 1: its last token's, then each draft's). Empty and None:
    # one row each.
    drafts: dict[int, list[int]] = field(default_factory=dict)
    draft_rows: DraftRows | None = None
    # A pooling runner's step: the hidden rows its pooler reads (logits_indices holds them);
    # nothing is sampled then.
    pool: PoolRows | None = None


class ModelRunner(KVCacheSetup):
    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig,
                 scheduler_config: SchedulerConfig, device: str = "auto",
                 attention_backend: str | None = None, seed: int = 0,
                 enforce_eager: bool = False,
                 graph_capturer: GraphCapturer | None = None,
                 tp: TPGroup | None = None,
                 lora_config: LoRAConfig | None = None) -> None:
        """enforce_eager: no CUDA graphs. graph_capturer: for tests, a stand-in for
        torch.cuda.CUDAGraph that makes the decode-graph path run on any device. tp: this
        rank's tensor-parallel group; the model is then its shard, and only rank 0 samples.
        lora_config: serve LoRA adapters (and no CUDA graphs: a graph would freeze one step's
        adapter groups)."""
        self.model_config = model_config
        self.tp = tp
        # What this rank's KV cache holds: its share of the KV heads under tensor parallelism.
        self.kv_config = model_config
        layout = None
        if tp is not None and tp.world_size > 1:
            layout = shard_layout(model_config, tp.rank, tp.world_size)
            self.kv_config = local_config(model_config, layout)
            # A captured graph would hold the collectives too; sharded steps run eagerly.
            enforce_eager = True
        self.kv_config = with_cache_dtype(self.kv_config, cache_config.cache_dtype)
        self.cache_config = cache_config
        self.scheduler_config = scheduler_config
        self.device = resolve_device(device)
        self.block_size = cache_config.block_size
        if self.device.type == "cpu":
            tune_cpu_allocator()
            logger.info("%s", probe_cpu_isa().describe())
            # Built (or loaded) here, before the engine reports ready: never inside a step.
            ensure_cpu_kernels_built()
        # Unseeded random sampling draws from the global generator: seed it for reproducibility.
        torch.manual_seed(seed)
        self.model = load_model(model_config, self.device, tp,
                                scheduler_config.max_model_len)
        if self.device.type == "cpu":
            # The packed weight layout (float32 panels or oneDNN's blocks), made once here instead
            # of in every call.
            packed = prepare_cpu_weights(self.model)
            logger.info("packed %d linear weights (float32: %s)", packed,
                        "Strand's panels" if cpu_linear_panels.chosen() else "oneDNN's blocks")
        self.lora_manager: LoRAManager | None = None
        if lora_config is not None:
            self.lora_manager = LoRAManager(
                self.model, lora_config, self.device, model_config.dtype,
                None if layout is None else LoRAShard(layout, model_config))
            enforce_eager = True
        self.attn_backend = get_attention_backend(
            attention_backend, self.device, self.block_size,
            converts_kv=self.kv_config.dtype != model_config.dtype)
        self.sampler = Sampler()
        # runner="pooling": every request's prompt is embedded instead of continued.
        # A sequence classifier's pooled rows go through its score layer (the model's head).
        self.pooler = (Pooler(scheduler_config.pooler,
                              self.model.lm_head if model_config.labels else None)
                       if scheduler_config.pooler is not None else None)
        # Grammar matchers of structured-output requests; the engine core gives it the
        # compiler (GrammarCache) built from its tokenizer.
        self.grammars = RunnerGrammars()
        self.kv_caches: list[torch.Tensor] = []
        self.requests: dict[str, CachedRequestState] = {}
        # Preempted requests come back as new ones; their seeded generator (and how far their
        # prompt logprobs got) is kept so the resumed output is what it would have been.
        self._suspended: dict[str, tuple[torch.Generator | None, int]] = {}
        # Worker side of the KV connector, attached by connector.factory when one is configured.
        self.kv_connector: KVConnectorBase | None = None
        # A tensor-parallel worker rank's share of the offload tier (rank 0's connector decides).
        self.offload_tier: CPUBlockTier | None = None
        self.enforce_eager = enforce_eager
        self._graph_capturer = graph_capturer
        self.decode_graphs: DecodeGraphRunner | None = None  # captured by initialize_kv_cache
        max_len = scheduler_config.max_model_len
        self.input_batch = InputBatch(scheduler_config.max_num_seqs, max_len + 1,
                                      -(-max_len // self.block_size) + 1)
        logger.info("model %s loaded on %s in %s (attention: %s, %d CPU threads)",
                    model_config.architecture, self.device, model_config.dtype,
                    describe_attention(self.attn_backend, self.device, model_config.dtype),
                    torch.get_num_threads())

    def shutdown(self) -> None:
        """Nothing to stop in one process (the tensor-parallel driver stops its workers)."""

    # ---- one step -----------------------------------------------------------------------------

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.update_states(scheduler_output)
        if self.kv_connector is not None and scheduler_output.kv_connector_metadata is not None:
            # Blocks the connector supplies must be in the paged cache before the forward.
            self.kv_connector.start_load_kv(scheduler_output.kv_connector_metadata,
                                            self.kv_caches)
        if scheduler_output.total_num_scheduled_tokens == 0 or not scheduler_output.num_reqs:
            return ModelRunnerOutput.empty()
        if not self.kv_caches:
            raise RuntimeError("initialize_kv_cache() must be called before execute_model()")
        inputs = self.prepare_inputs(scheduler_output)
        if inputs.pool is not None:
            return self._pool(inputs)
        logits = self.compute_logits(inputs)  # [num_sampled + num_prompt_rows, vocab]
        if not self.is_driver:
            # Rank 0 samples; its tokens reach this rank with the next step (apply_sampled).
            self._advance_prompt_logprobs(inputs)
            return ModelRunnerOutput.empty()
        num_rows = len(inputs.sample_reqs) + sum(len(d) for d in inputs.drafts.values())
        sampled_lists: list[list[int]] = [[] for _ in inputs.req_ids]
        logprobs = None
        draft_logprobs: dict[str, LogprobsLists] = {}
        if inputs.draft_rows is not None:
            logprobs = self._sample_with_drafts(inputs, inputs.draft_rows, logits[:num_rows],
                                                sampled_lists, draft_logprobs)
        elif num_rows:
            logprobs = self._sample_one_each(inputs.sample_reqs, inputs.req_ids,
                                             logits[:num_rows], sampled_lists)
        prompt_logprobs = self._prompt_logprobs(inputs, logits[num_rows:])
        return ModelRunnerOutput(
            req_ids=inputs.req_ids,
            req_id_to_index={r: i for i, r in enumerate(inputs.req_ids)},
            sampled_token_ids=sampled_lists,
            logprobs=logprobs,
            prompt_logprobs_dict=prompt_logprobs,
            draft_logprobs=draft_logprobs,
        )

    def compute_logits(self, inputs: StepInputs) -> torch.Tensor:
        """The forward pass; logits only at inputs.logits_indices. [n, vocab] in model dtype."""
        if inputs.graph_size is None or self.decode_graphs is None:
            # A few decodes on CPU: the layers and the lm_head in one C++ call, where it applies.
            decode_logits = getattr(self.model, "decode_logits", None)
            if decode_logits is not None:
                logits = decode_logits(inputs.input_ids, inputs.positions, self.kv_caches,
                                       inputs.metadata, self.attn_backend,
                                       rows=inputs.logits_indices)
                if logits is not None:
                    return logits
        return self.model.compute_logits(self.hidden_states(inputs))

    def hidden_states(self, inputs: StepInputs) -> torch.Tensor:
        """The forward pass up to the final norm, at inputs.logits_indices: [n, hidden]."""
        if inputs.graph_size is not None and self.decode_graphs is not None:
            # Rows past the step's tokens are padding; logits_indices never points there.
            return self.decode_graphs.replay(inputs.graph_size)[inputs.logits_indices]
        # The model runs its last layer past attention for these rows alone.
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.metadata,
                          self.attn_backend, rows=inputs.logits_indices)

    def _pool(self, inputs: StepInputs) -> ModelRunnerOutput:
        """A pooling runner's step: the hidden rows its pooler reads; the embeddings of the
        requests whose prompt ended (rank 0: the others only join the forward's collectives)."""
        assert self.pooler is not None and inputs.pool is not None
        hidden = self.hidden_states(inputs)
        if not self.is_driver:
            return ModelRunnerOutput.empty()
        prompt_lens = [len(self.requests[r].prompt_token_ids) for r in inputs.req_ids]
        return ModelRunnerOutput(
            req_ids=inputs.req_ids,
            req_id_to_index={r: i for i, r in enumerate(inputs.req_ids)},
            sampled_token_ids=[[] for _ in inputs.req_ids],
            pooler_output=self.pooler.pool(inputs.req_ids, prompt_lens, inputs.pool, hidden),
        )

    @property
    def is_driver(self) -> bool:
        """The rank that samples (the only one without tensor parallelism)."""
        return self.tp is None or self.tp.is_driver

    def apply_sampled(self, tokens: dict[str, list[int]]) -> None:
        """A worker rank: append the tokens rank 0 sampled last step, before this step runs."""
        for req_id, token_ids in tokens.items():
            state = self.requests.get(req_id)
            if state is not None:
                for token in token_ids:
                    self._append_token(state, token)

    def _advance_prompt_logprobs(self, inputs: StepInputs) -> None:
        """A worker rank keeps rank 0's prompt-logprob progress, so both pick the same rows."""
        for i, (first, count) in inputs.prompt_spans.items():
            self.requests[inputs.req_ids[i]].prompt_logprobs_done = first + count

    def update_states(self, so: SchedulerOutput) -> None:
        """Apply the scheduler's decisions to the runner's copies of the requests."""
        for req_id in so.finished_req_ids:
            self._remove(req_id)
            self._suspended.pop(req_id, None)
        for req_id in so.preempted_req_ids:
            state = self._remove(req_id)
            if state is not None:
                self._suspended[req_id] = (state.generator, state.prompt_logprobs_done)
        cached = so.scheduled_cached_reqs
        for req_id, new_blocks, num_computed in zip(cached.req_ids, cached.new_block_ids,
                                                    cached.num_computed_tokens, strict=True):
            state = self.requests.get(req_id)
            if state is None:
                raise RuntimeError(f"scheduled_cached_reqs names {req_id!r}, which the runner "
                                   "does not hold (never sent as new, or already dropped)")
            if new_blocks:
                state.block_ids.extend(new_blocks)
                self.input_batch.append_blocks(state.row, new_blocks)
            state.num_computed_tokens = num_computed
        for new in so.scheduled_new_reqs:
            self._remove(new.req_id)
            generator, done = self._suspended.pop(new.req_id, (None, 0))
            if generator is None:
                generator = make_generator(new.sampling_params.seed, self.device)
            tokens = [*new.prompt_token_ids, *new.output_token_ids]
            row = self.input_batch.add(tokens, new.block_ids)
            eos = (new.eos_token_id if new.eos_token_id is not None
                   else self.model_config.first_eos_token_id)
            self.requests[new.req_id] = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=list(new.prompt_token_ids),
                output_token_ids=list(new.output_token_ids),
                params=new.sampling_params,
                generator=generator,
                eos_token_id=eos,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                row=row,
                lora_request=new.lora_request,
                argmax_only=argmax_only(new.sampling_params, eos, self.model_config.vocab_size),
                # Output exists only once the whole prompt was computed.
                prompt_logprobs_done=max(done, len(new.prompt_token_ids)
                                         if new.output_token_ids else 0),
            )

    def _remove(self, req_id: str) -> CachedRequestState | None:
        if self.pooler is not None:
            # Finished, or preempted: a resumed request recomputes its whole prompt.
            self.pooler.forget(req_id)
        state = self.requests.pop(req_id, None)
        if state is not None:
            self.input_batch.remove(state.row)
        return state

    def _append_token(self, state: CachedRequestState, token: int) -> None:
        self.input_batch.set_token(state.row, state.num_tokens, token)
        state.output_token_ids.append(token)

    def prepare_inputs(self, so: SchedulerOutput) -> StepInputs:
        """Host-side numpy over all requests at once; one copy per tensor to the device."""
        req_ids = list(so.num_scheduled_tokens)
        states = [self.requests[r] for r in req_ids]
        n = len(req_ids)
        rows = np.fromiter((s.row for s in states), np.int64, n)
        query_lens = np.fromiter(so.num_scheduled_tokens.values(), np.int64, n)
        computed = np.fromiter((s.num_computed_tokens for s in states), np.int64, n)
        known = np.fromiter((s.num_tokens for s in states), np.int64, n)
        seq_lens = computed + query_lens
        batch = self.input_batch
        drafts = self._place_drafts(so.scheduled_spec_decode_tokens, req_ids, states, known)
        check_schedule(req_ids, seq_lens, known, batch.num_blocks[rows] * self.block_size)

        ends = np.cumsum(query_lens)
        req_of_token = np.repeat(np.arange(n), query_lens)
        positions = np.arange(int(ends[-1])) - (ends - query_lens)[req_of_token] + computed[
            req_of_token]
        if self.lora_manager is not None:
            # Each adapted Linear reads the step's token groups; the CPU fused decode step
            # (which reads base weights only) stands aside for a batch with an adapter.
            self.model.lora_active = self.lora_manager.set_batch(
                [s.lora_request for s in states], req_of_token)
        token_rows = rows[req_of_token]
        input_ids = batch.token_ids[token_rows, positions]
        slots = batch.block_table[token_rows, positions // self.block_size].astype(np.int64)
        slots = slots * self.block_size + positions % self.block_size
        # Attention's view of the step: a request a row, or (verifying drafts) a token a row.
        attn_q, attn_seq, attn_rows = query_lens, seq_lens, rows
        if drafts and _verify_only(query_lens, drafts):
            attn_q, attn_seq, attn_rows = np.ones_like(positions), positions + 1, token_rows
        graphs = self.decode_graphs
        graph_size = graphs.padded_size(attn_q, attn_seq) if graphs is not None else None
        if graphs is not None and graph_size is not None:
            ids_t, positions_t, metadata = graphs.load(graph_size, input_ids, positions, slots,
                                                       attn_seq, batch.block_table[attn_rows])
        else:
            metadata = build_attention_metadata(attn_q, attn_seq, slots,
                                                batch.block_table[attn_rows], self.block_size,
                                                self.device)
            ids_t = torch.from_numpy(input_ids).to(self.device)
            positions_t = torch.from_numpy(positions).to(self.device)

        # A request is sampled when this step reaches its last known token (or draft).
        reaches_end = (seq_lens == known) & (query_lens > 0)
        if self.pooler is not None:
            # Nothing is sampled: the pooler's rows are the step's only output rows.
            pool = self.pooler.rows(query_lens, computed, ends, reaches_end)
            return StepInputs(req_ids=req_ids, input_ids=ids_t, positions=positions_t,
                              metadata=metadata, sample_reqs=np.empty(0, np.int64),
                              logits_indices=torch.from_numpy(pool.rows).to(self.device),
                              prompt_spans={}, graph_size=graph_size, pool=pool)
        sample_reqs = np.nonzero(reaches_end)[0]
        draft_rows = DraftRows.of(sample_reqs, drafts) if drafts else None
        logits_rows = [ends[sample_reqs] - 1 if draft_rows is None
                       else draft_rows.logits_rows(ends[sample_reqs])]
        prompt_spans: dict[int, tuple[int, int]] = {}
        for i, state in enumerate(states):
            if state.params.prompt_logprobs is None:
                continue
            # Position p's logits score prompt token p + 1: positions up to len(prompt) - 2.
            first = max(int(computed[i]), state.prompt_logprobs_done)
            last = min(int(seq_lens[i]), len(state.prompt_token_ids) - 1)
            if last > first:
                prompt_spans[i] = (first, last - first)
                row0 = int(ends[i] - query_lens[i]) + first - int(computed[i])
                logits_rows.append(np.arange(row0, row0 + last - first))
        return StepInputs(
            req_ids=req_ids,
            input_ids=ids_t,
            positions=positions_t,
            metadata=metadata,
            sample_reqs=sample_reqs,
            logits_indices=torch.from_numpy(np.concatenate(logits_rows)).to(self.device),
            prompt_spans=prompt_spans,
            graph_size=graph_size,
            drafts=drafts,
            draft_rows=draft_rows,
        )

    def _place_drafts(self, drafts_of: dict[str, list[int]], req_ids: list[str],
                      states: list[CachedRequestState], known: np.ndarray
                      ) -> dict[int, list[int]]:
        """Write each request's drafts after its known tokens (the step's input ids are cut from
        there) and count them as known; req index -> drafts."""
        if not drafts_of:
            return {}
        index_of = {req_id: i for i, req_id in enumerate(req_ids)}
        placed: dict[int, list[int]] = {}
        for req_id, draft in drafts_of.items():
            i = index_of[req_id]
            state = states[i]
            self.input_batch.set_tokens(state.row, state.num_tokens, draft)
            known[i] += len(draft)
            placed[i] = draft
        return placed

    def _sample(self, sample_reqs: np.ndarray, req_ids: list[str],
                logits: torch.Tensor) -> SamplerOutput:
        states = [self.requests[req_ids[i]] for i in sample_reqs.tolist()]
        if not self.sampler.logits_processors and all(s.argmax_only for s in states):
            # What the sampler would do, without building the metadata that tells it so.
            return SamplerOutput(argmax_tokens(logits), None)
        rows = []
        for s in states:
            if s.grammar is None and s.params.structured_outputs is not None:
                # At the first sample, so the compile overlapped the prefill; a resumed
                # (preempted) request replays its kept output through the new matcher.
                s.grammar = self.grammars.matcher_for(s.params, s.output_token_ids,
                                                      s.eos_token_id)
            rows.append(SamplingRow(s.params, s.prompt_token_ids, s.output_token_ids,
                                    s.generator, s.eos_token_id, s.grammar))
        metadata = build_sampling_metadata(rows, self.model_config.vocab_size, self.device)
        return self.sampler(logits, metadata)

    def _sample_one_each(self, sample_reqs: np.ndarray, req_ids: list[str],
                         logits: torch.Tensor, sampled_lists: list[list[int]]
                         ) -> LogprobsLists | None:
        """A token for each of sample_reqs (a logits row each), appended to its state; their
        logprobs, in the scheduler's order."""
        out = self._sample(sample_reqs, req_ids, logits)
        for i, token in zip(sample_reqs.tolist(), out.sampled_token_ids.tolist(), strict=True):
            sampled_lists[i] = [token]
            state = self.requests[req_ids[i]]
            self._append_token(state, token)
            if state.grammar is not None:
                self.grammars.accept(state.req_id, state.grammar, token)
        return spread_logprobs(out.logprobs, sample_reqs, len(req_ids))

    def _sample_with_drafts(self, inputs: StepInputs, rows: DraftRows, logits: torch.Tensor,
                            sampled_lists: list[list[int]],
                            draft_logprobs: dict[str, LogprobsLists]) -> LogprobsLists | None:
        """A step that verifies drafts: requests without one are sampled as in any step (their
        logprobs too); each drafted request keeps its accepted drafts and one token more (and
        their logprobs into draft_logprobs, a row each, when it asked)."""
        plain = inputs.sample_reqs[~rows.drafted]
        logprobs = None
        if len(plain):
            logprobs = self._sample_one_each(plain, inputs.req_ids,
                                             logits[rows.first[~rows.drafted]], sampled_lists)
        drafted = inputs.sample_reqs[rows.drafted].tolist()
        states = [self.requests[inputs.req_ids[i]] for i in drafted]
        verified = verify_drafts(logits, rows, drafted, inputs.drafts, states, self.sampler,
                                 self.model_config.vocab_size, self.device)
        firsts = rows.first[rows.drafted].tolist()
        for i, state, tokens, first in zip(drafted, states, verified, firsts, strict=True):
            sampled_lists[i] = tokens
            for token in tokens:
                self._append_token(state, token)
            if state.params.logprobs is not None:
                draft_logprobs[state.req_id] = emitted_logprobs(logits, first, tokens,
                                                                state.params.logprobs)
        return logprobs

    def _prompt_logprobs(self, inputs: StepInputs,
                         logits: torch.Tensor) -> dict[str, LogprobsLists | None]:
        result: dict[str, LogprobsLists | None] = {}
        offset = 0
        for i, (first, count) in inputs.prompt_spans.items():
            state = self.requests[inputs.req_ids[i]]
            targets = torch.tensor(state.prompt_token_ids[first + 1:first + 1 + count],
                                   dtype=torch.int64, device=self.device)
            num_logprobs = state.params.prompt_logprobs or 0
            result[state.req_id] = compute_prompt_logprobs(logits[offset:offset + count], targets,
                                                           num_logprobs)
            state.prompt_logprobs_done = first + count
            offset += count
        return result


def _verify_only(query_lens: np.ndarray, drafts: dict[int, list[int]]) -> bool:
    """Every request computes just its last token and its drafts. Each token can then attend
    as a decode row of its own (the request's block table, its position + 1 as the length):
    every K/V of the step is written before any row attends, so row j sees the drafts before
    it and none after. The step then takes the decode paths (the fused CPU step, CUDA graphs)
    instead of a prefill's."""
    expected = np.ones_like(query_lens)
    for i, draft in drafts.items():
        expected[i] += len(draft)
    return bool((query_lens == expected).all())
