"""Greedy sampling and the logit processing before it: masks, bias, min_tokens, penalties."""

from __future__ import annotations

import torch

from strand.engine_core.model_executor.sampling.penalties import apply_penalties, token_counts
from tests.engine_core.model_executor.sampler_helpers import (
    make_metadata,
    make_row,
    random_logits,
    reference_penalties,
    sample,
)


def test_greedy_rows_take_the_argmax_of_the_logits() -> None:
    logits = random_logits(4, 50)
    out = sample(logits, [make_row(temperature=0.0) for _ in range(4)])
    assert out.sampled_token_ids.tolist() == logits.argmax(dim=-1).tolist()
    assert out.sampled_token_ids.dtype == torch.int64


def test_sampler_leaves_the_callers_logits_unchanged() -> None:
    logits = random_logits(2, 20)
    before = logits.clone()
    rows = [make_row(temperature=0.0, logit_bias={3: 5.0}, allowed_token_ids=[1, 3]),
            make_row(temperature=0.8, top_k=3, min_tokens=2, stop_token_ids=[4],
                     repetition_penalty=1.5, output=[1, 2])]
    sample(logits, rows)
    assert torch.equal(logits, before)


def test_logit_bias_moves_the_greedy_choice() -> None:
    logits = torch.zeros(1, 10)
    logits[0, 2] = 1.0
    out = sample(logits, [make_row(temperature=0.0, logit_bias={7: 1.5})])
    assert out.sampled_token_ids.tolist() == [7]


def test_allowed_token_ids_restrict_the_choice_to_that_set() -> None:
    logits = torch.arange(10, dtype=torch.float32).unsqueeze(0)  # token 9 is best
    rows = [make_row(temperature=0.0, allowed_token_ids=[2, 5]), make_row(temperature=0.0)]
    out = sample(logits.repeat(2, 1), rows)
    assert out.sampled_token_ids.tolist() == [5, 9]


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(1, 10)
    logits[0, 9], logits[0, 8], logits[0, 1] = 3.0, 2.0, 1.0  # eos 9, stop id 8
    before = make_row(temperature=0.0, eos=9, min_tokens=2, stop_token_ids=[8], output=[0])
    reached = make_row(temperature=0.0, eos=9, min_tokens=2, stop_token_ids=[8], output=[0, 0])
    out = sample(logits.repeat(2, 1), [before, reached])
    assert out.sampled_token_ids.tolist() == [1, 9]


def test_min_tokens_leaves_eos_alone_when_ignore_eos() -> None:
    logits = torch.zeros(1, 10)
    logits[0, 9] = 3.0
    row = make_row(temperature=0.0, eos=9, min_tokens=3, ignore_eos=True)
    assert sample(logits, [row]).sampled_token_ids.tolist() == [9]


def test_token_counts_count_each_id_and_drop_the_padding() -> None:
    ids = torch.tensor([[1, 1, 3, 5], [2, 5, 5, 5]])  # 5 = vocab_size = padding
    counts = token_counts(ids, vocab_size=5)
    assert counts.tolist() == [[0, 2, 0, 1, 0], [0, 0, 1, 0, 0]]


def test_penalties_match_the_per_token_reference() -> None:
    vocab = 30
    logits = random_logits(3, vocab, seed=1)
    rows = [
        make_row(prompt=[1, 2, 3], output=[4, 4, 4, 7], repetition_penalty=1.3,
                 frequency_penalty=0.5, presence_penalty=0.25),
        make_row(prompt=[10, 11], output=[], repetition_penalty=0.7),
        make_row(prompt=[5], output=[5, 6, 6], frequency_penalty=-0.4, presence_penalty=1.5),
    ]
    metadata = make_metadata(rows, vocab)
    assert metadata.penalties is not None
    got = apply_penalties(logits.clone(), metadata.penalties)
    torch.testing.assert_close(got.double(), reference_penalties(logits, rows))


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
    rows = [make_row(prompt=[0], output=[1], repetition_penalty=2.0)]
    metadata = make_metadata(rows, 4)
    assert metadata.penalties is not None
    got = apply_penalties(logits, metadata.penalties)
    assert got.tolist() == [[1.0, -4.0, 2.0, -2.0]]


def test_frequency_and_presence_penalties_change_the_greedy_choice() -> None:
    logits = torch.tensor([[3.0, 2.5, 0.0]])
    # Token 0 seen twice: 3.0 - 2 * 0.2 - 0.3 = 2.3 < 2.5.
    row = make_row(temperature=0.0, output=[0, 0], frequency_penalty=0.2, presence_penalty=0.3)
    assert sample(logits, [row]).sampled_token_ids.tolist() == [1]


def test_greedy_rows_stay_greedy_inside_a_random_batch() -> None:
    torch.manual_seed(0)
    logits = random_logits(6, 40, seed=2)
    rows = [make_row(temperature=0.0 if i % 2 == 0 else 1.5) for i in range(6)]
    for _ in range(5):
        out = sample(logits, rows).sampled_token_ids
        assert out[0::2].tolist() == logits[0::2].argmax(dim=-1).tolist()


def test_greedy_ignores_top_k_top_p_and_min_p() -> None:
    logits = random_logits(1, 40, seed=3)
    row = make_row(temperature=0.0, top_k=1, top_p=0.01, min_p=0.9)
    assert sample(logits, [row]).sampled_token_ids.tolist() == [int(logits.argmax())]


def test_logit_bias_cannot_bring_back_a_token_outside_allowed_token_ids() -> None:
    logits = torch.zeros(1, 10)
    row = make_row(temperature=0.0, allowed_token_ids=[2, 3], logit_bias={7: 100.0, 3: 1.0})
    assert sample(logits, [row]).sampled_token_ids.tolist() == [3]
