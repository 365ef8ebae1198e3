"""Verifying drafts against the target model's logits (the runner's side of speculative decoding).

A drafted request's step computes logits at its last token and at each draft, so row j scores
the token after draft j - 1, and is processed (penalties, bad words, min_tokens) with drafts
0..j-1 in the request's output, as it would be had they been decoded one at a time. Greedy rows accept drafts while each equals the argmax and then
add the argmax where the first one differs (or after the last draft): exactly the tokens
one-at-a-time decoding would give. Random rows use rejection sampling with a draft that is one
token (prompt lookup has no draft distribution): draft d at row j is accepted with probability
p_j(d); on the first rejection the token is drawn from p_j with d removed, renormalized; after
the last accepted draft one more token comes from the next row. Each emitted token is then
distributed as p, the target's (Leviathan et al., 2023), though a seeded request draws other
random numbers than it would one token at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from strand.engine_core.core.runner_output import LogprobsLists
from strand.engine_core.model_executor.input_batch import CachedRequestState
from strand.engine_core.model_executor.sampler import Sampler, argmax_tokens, exponential_race
from strand.engine_core.model_executor.sampling.logprobs import gather_logprobs
from strand.engine_core.model_executor.sampling_metadata import SamplingRow, build_sampling_metadata


@dataclass(slots=True)
class DraftRows:
    """Where each sampled request's logits rows are, in the scheduler's order."""

    counts: np.ndarray  # [num_sampled] rows each: 1 + its drafts
    first: np.ndarray  # [num_sampled] its first row in the step's logits
    drafted: np.ndarray  # [num_sampled] bool: it verifies drafts

    @classmethod
    def of(cls, sample_reqs: np.ndarray, drafts: dict[int, list[int]]) -> DraftRows:
        counts = np.fromiter((len(drafts.get(i, ())) + 1 for i in sample_reqs.tolist()),
                             np.int64, len(sample_reqs))
        return cls(counts, np.cumsum(counts) - counts, counts > 1)

    def logits_rows(self, ends: np.ndarray) -> np.ndarray:
        """The hidden rows whose logits are computed, given where each sampled request's tokens
        end in the step: each request's last `count` rows."""
        return np.repeat(ends - self.counts - self.first, self.counts) + np.arange(
            int(self.counts.sum()))

    def drafted_rows(self) -> np.ndarray:
        """The rows of the drafted requests, each request's consecutive."""
        counts, first = self.counts[self.drafted], self.first[self.drafted]
        starts = np.cumsum(counts) - counts
        return np.repeat(first - starts, counts) + np.arange(int(counts.sum()))


def verify_drafts(logits: torch.Tensor, rows: DraftRows, drafted: list[int],
                  drafts: dict[int, list[int]], states: Sequence[CachedRequestState],
                  sampler: Sampler, vocab_size: int, device: torch.device) -> list[list[int]]:
    """Each drafted request's tokens this step: its accepted drafts, then one more."""
    target = logits[torch.from_numpy(rows.drafted_rows()).to(logits.device)]
    draft_lists = [drafts[i] for i in drafted]
    if not sampler.logits_processors and all(s.argmax_only for s in states):
        return _accept_greedy(argmax_tokens(target).tolist(), draft_lists)
    # Row j is used only when drafts 0..j-1 were accepted: it is processed as one-at-a-time
    # decoding would process it then, with them in its output (penalties, bad words and
    # min_tokens read the output so far).
    sampling_rows = [SamplingRow(s.params, s.prompt_token_ids,
                                 [*s.output_token_ids, *draft[:j]] if j else s.output_token_ids,
                                 s.generator, s.eos_token_id)
                     for s, draft in zip(states, draft_lists, strict=True)
                     for j in range(len(draft) + 1)]
    metadata = build_sampling_metadata(sampling_rows, vocab_size, device)
    processed = sampler.processed_logits(target, metadata)
    argmax = argmax_tokens(processed).tolist()
    probs = None if metadata.all_greedy else sampler.random_probs(processed, metadata)
    out: list[list[int]] = []
    row = 0
    for state, draft in zip(states, draft_lists, strict=True):
        count = len(draft) + 1
        if state.params.is_greedy or probs is None:
            out += _accept_greedy(argmax[row:row + count], [draft])
        else:
            out.append(_accept_random(probs[row:row + count], draft, state.generator))
        row += count
    return out


def emitted_logprobs(logits: torch.Tensor, first_row: int, tokens: list[int],
                     num_logprobs: int) -> LogprobsLists:
    """The raw model's logprobs of a drafted request's tokens this step: token j came from
    row first_row + j (an accepted draft at its row, the last token at the row after)."""
    rows = logits[first_row:first_row + len(tokens)].to(torch.float32)
    return gather_logprobs(torch.log_softmax(rows, dim=-1),
                           torch.tensor(tokens, dtype=torch.int64, device=logits.device),
                           num_logprobs)


def _accept_greedy(argmax: list[int], draft_lists: list[list[int]]) -> list[list[int]]:
    """argmax: the rows of every request in turn; per request the drafts up to the first that
    is not its row's argmax, then that row's argmax."""
    out = []
    row = 0
    for draft in draft_lists:
        tokens = []
        for j, token in enumerate(draft):
            tokens.append(argmax[row + j])
            if token != tokens[-1]:
                break
        else:
            tokens.append(argmax[row + len(draft)])
        out.append(tokens)
        row += len(draft) + 1
    return out


def _accept_random(probs: torch.Tensor, draft: list[int],
                   generator: torch.Generator | None) -> list[int]:
    """probs: [len(draft) + 1, vocab], the target's distribution at each row."""
    k = len(draft)
    index = torch.arange(k, device=probs.device)
    draft_t = torch.tensor(draft, dtype=torch.int64, device=probs.device)
    p_draft = probs[index, draft_t]
    u = torch.rand(k, generator=generator, device=probs.device)
    rejected = torch.nonzero(u >= p_draft)
    num_accepted = int(rejected[0, 0]) if len(rejected) else k
    last = probs[num_accepted]
    if num_accepted < k:
        last = last.clone()
        last[draft[num_accepted]] = 0.0  # (p - one_hot(d))+ ∝ p without d
        if not bool(last.gt(0).any()):
            last = probs[num_accepted]  # d held all the mass: it cannot have been rejected
    generators = {0: generator} if generator is not None else {}
    token = int(exponential_race(last.unsqueeze(0).clone(), generators)[0])
    return [*draft[:num_accepted], token]
