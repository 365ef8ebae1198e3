"""Verifying drafts: greedy rows give exactly one-at-a-time decoding's tokens; random rows give
tokens distributed as the target's own sampling (rejection sampling), whatever the draft."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import torch

from strand.engine_core.model_executor.input_batch import CachedRequestState
from strand.engine_core.model_executor.sampler import Sampler
from strand.engine_core.model_executor.sampling_metadata import argmax_only
from strand.engine_core.sampling_params import SamplingParams
from strand.engine_core.spec_decode.verify import DraftRows, verify_drafts

VOCAB = 6
CPU = torch.device("cpu")


def state(params: SamplingParams, seed: int | None = None) -> CachedRequestState:
    generator = None
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
    return CachedRequestState(req_id="r", prompt_token_ids=[1, 2], output_token_ids=[3],
                              params=params, generator=generator, eos_token_id=0, block_ids=[],
                              num_computed_tokens=0, row=0,
                              argmax_only=argmax_only(params, 0, VOCAB))


def verify(logits: torch.Tensor, drafts: list[list[int]],
           states: list[CachedRequestState]) -> list[list[int]]:
    """Requests 0..n-1 all sampled and drafted; logits rows laid out as the runner lays them."""
    sample_reqs = np.arange(len(drafts))
    by_index = dict(enumerate(drafts))
    rows = DraftRows.of(sample_reqs, by_index)
    return verify_drafts(logits, rows, list(range(len(drafts))), by_index, states, Sampler(),
                         VOCAB, CPU)


def one_hot_rows(argmax: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(argmax), VOCAB)
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] = 5.0
    return logits


def test_greedy_keeps_the_drafts_up_to_the_first_miss_then_the_argmax() -> None:
    greedy = SamplingParams(temperature=0.0)
    # Three requests: all accepted (+ the bonus), the second draft missed, the first missed.
    logits = torch.cat([one_hot_rows([4, 2, 5, 1]), one_hot_rows([4, 2, 3]),
                        one_hot_rows([1, 1])])
    got = verify(logits, [[4, 2, 5], [4, 5], [3]], [state(greedy)] * 3)
    assert got == [[4, 2, 5, 1], [4, 2], [1]]


def test_greedy_rows_read_the_processed_logits() -> None:
    """A greedy request with a logit_bias takes the general path: the bias moves the argmax."""
    biased = SamplingParams(temperature=0.0, logit_bias={3: 10.0})
    assert not state(biased).argmax_only
    got = verify(one_hot_rows([4, 2, 5]), [[3, 3]], [state(biased)])
    assert got == [[3, 3, 3]]


def test_each_draft_row_sees_the_drafts_before_it_in_the_output() -> None:
    """Row j is processed as if drafts 0..j-1 had been decoded: a presence penalty on a token
    the first draft brought, a bad word a draft completes, min_tokens counted past the drafts."""
    flat = torch.tensor([[0.0, 0.0, 1.0, 0.0, 3.0, 2.5]] * 3)  # 4 leads 5 by 0.5
    # Draft 4 is accepted at row 0; at row 1 the penalty (4 is now in the output) gives 5.
    penalized = SamplingParams(temperature=0.0, presence_penalty=1.0)
    assert verify(flat, [[4, 4]], [state(penalized)]) == [[4, 5]]
    # [2, 4] is a bad word: once draft 2 is in the output, 4 is banned at the next row.
    banned = SamplingParams(temperature=0.0, bad_words_token_ids=[[2, 4]])
    leads_2 = torch.tensor([[0.0, 0.0, 4.0, 0.0, 3.0, 2.5], [0.0, 0.0, 1.0, 0.0, 3.0, 2.5]])
    assert verify(leads_2, [[2]], [state(banned)]) == [[2, 5]]
    # EOS (0) leads every row; min_tokens 3 bans it up to the third token (one in the output
    # before the step): rows 0 and 1 take 4 and 4, row 2 may end.
    eos_leads = torch.tensor([[9.0, 0.0, 1.0, 0.0, 3.0, 2.5]] * 3)
    early = SamplingParams(temperature=0.0, min_tokens=3)
    assert verify(eos_leads, [[4, 4]], [state(early)]) == [[4, 4, 0]]


def within(observed: int, n: int, p: float) -> bool:
    """observed ~ Binomial(n, p), within 5 standard deviations (false alarm ~1e-6)."""
    return abs(observed - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1


def test_random_rows_emit_the_targets_distribution_whatever_the_draft() -> None:
    torch.manual_seed(0)
    target = torch.tensor([[0.1, 0.4, 0.2, 0.3, -1.0, 0.0],
                           [1.0, -0.5, 0.3, 0.0, 0.2, 0.1],
                           [0.0, 0.0, 0.5, -0.2, 0.9, 0.4]]) * 2
    probs = target.softmax(-1)
    draft = [3, 0]  # p(3) = 0.29 at row 0, p(0) = 0.34 at row 1: rejected often
    params = SamplingParams(temperature=1.0)
    batch, rounds = 100, 60
    firsts: Counter[int] = Counter()
    seconds: Counter[int] = Counter()
    thirds: Counter[int] = Counter()
    lengths: Counter[int] = Counter()
    for _ in range(rounds):
        out = verify(target.repeat(batch, 1), [draft] * batch, [state(params)] * batch)
        for tokens in out:
            lengths[len(tokens)] += 1
            firsts[tokens[0]] += 1
            if tokens[0] == draft[0]:  # accepted: the next token is row 1's
                seconds[tokens[1]] += 1
                if tokens[1] == draft[1]:
                    thirds[tokens[2]] += 1
    n = batch * rounds
    for token in range(VOCAB):
        assert within(firsts[token], n, float(probs[0, token])), ("first", token, firsts)
        n2 = firsts[draft[0]]
        assert within(seconds[token], n2, float(probs[1, token])), ("second", token, seconds)
        n3 = seconds[draft[1]]
        assert within(thirds[token], n3, float(probs[2, token])), ("third", token, thirds)
    # Emitted lengths: 1 on a first rejection, 2 on a second, 3 when both drafts were accepted.
    assert within(lengths[3], n, float(probs[0, 3] * probs[1, 0]))


def test_random_rows_keep_top_k_and_temperature() -> None:
    """The verifier draws from the request's distribution: top_k=1 at any temperature is the
    argmax, so a draft off the argmax is always replaced by it."""
    params = SamplingParams(temperature=1.5, top_k=1)
    for _ in range(20):
        assert verify(one_hot_rows([4, 2]), [[1]], [state(params)]) == [[4]]
        assert verify(one_hot_rows([4, 2]), [[4]], [state(params)]) == [[4, 2]]


def test_a_seeded_request_draws_the_same_tokens_again() -> None:
    params = SamplingParams(temperature=1.0, seed=11)
    logits = torch.zeros(4, VOCAB)  # uniform: drafts rejected often, replacements random
    runs = [verify(logits.repeat(8, 1), [[1, 2, 3]] * 8,
                   [state(params, seed=11 + i) for i in range(8)]) for _ in range(2)]
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0]}) > 1  # each request its own generator
