"""build_sampling_metadata: flags that let the sampler skip stages, and input validation."""

from __future__ import annotations

import pytest
import torch

from strand.engine_core.model_executor.sampler import Sampler
from strand.engine_core.model_executor.sampling_metadata import SamplingRow, make_generator
from tests.engine_core.model_executor.sampler_helpers import CPU, make_metadata, make_row


def test_an_all_greedy_batch_carries_nothing_but_the_argmax_flag() -> None:
    metadata = make_metadata([make_row(temperature=0.0), make_row(temperature=0.0)], 16)
    assert metadata.all_greedy and not metadata.all_random
    assert metadata.temperature is None and metadata.greedy_mask is None
    assert metadata.top_k is None and metadata.top_p is None and metadata.min_p is None
    assert metadata.penalties is None and metadata.masks.is_empty
    assert metadata.max_num_logprobs is None


def test_a_mixed_batch_marks_its_greedy_rows_and_gives_them_temperature_one() -> None:
    metadata = make_metadata([make_row(temperature=0.0), make_row(temperature=0.5)], 16)
    assert not metadata.all_greedy and not metadata.all_random
    assert metadata.greedy_mask is not None and metadata.greedy_mask.tolist() == [True, False]
    assert metadata.temperature is not None and metadata.temperature.tolist() == [1.0, 0.5]


def test_truncation_stages_are_skipped_when_no_random_row_uses_them() -> None:
    metadata = make_metadata([make_row(temperature=0.0, top_k=2, top_p=0.5, min_p=0.1),
                              make_row()], 16)
    assert metadata.top_k is None and metadata.top_p is None and metadata.min_p is None


def test_top_k_larger_than_the_vocab_means_off_and_max_top_k_ignores_off_rows() -> None:
    metadata = make_metadata([make_row(top_k=100), make_row(top_k=3), make_row()], 16)
    assert metadata.top_k is not None and metadata.top_k.tolist() == [16, 3, 16]
    assert metadata.max_top_k == 3


def test_prompt_ids_are_only_gathered_for_the_repetition_penalty() -> None:
    metadata = make_metadata([make_row(prompt=[1, 2, 3], output=[4], presence_penalty=0.5),
                              make_row(prompt=[5])], 16)
    assert metadata.penalties is not None
    assert metadata.penalties.prompt_token_ids is None
    assert metadata.penalties.output_token_ids.tolist() == [[4], [16]]


def test_generators_are_kept_for_seeded_random_rows_only() -> None:
    rows = [make_row(seed=1), make_row(seed=2, temperature=0.0), make_row()]
    assert list(make_metadata(rows, 16).generators) == [0]


def test_max_num_logprobs_is_the_largest_asked_and_logprob_rows_name_who_asked() -> None:
    metadata = make_metadata([make_row(logprobs=2), make_row(), make_row(logprobs=0)], 16)
    assert metadata.max_num_logprobs == 2
    assert metadata.logprob_rows == [0, 2]


def test_make_generator_gives_none_without_a_seed_and_a_repeatable_stream_with_one() -> None:
    assert make_generator(None, CPU) is None
    a, b = make_generator(5, CPU), make_generator(5, CPU)
    assert a is not None and b is not None
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))


@pytest.mark.parametrize(("row", "field"), [
    (make_row(allowed_token_ids=[3, 16]), "allowed_token_ids"),
    (make_row(logit_bias={20: 1.0}), "logit_bias"),
    (make_row(stop_token_ids=[16]), "stop_token_ids"),
    (make_row(eos=16), "eos_token_id"),
    (make_row(output=[16], frequency_penalty=0.1), "output_token_ids"),
    (make_row(prompt=[-1], repetition_penalty=1.1), "prompt_token_ids"),
])
def test_token_ids_outside_the_vocab_raise_naming_the_field(row: SamplingRow, field: str) -> None:
    with pytest.raises(ValueError, match=rf"{field}.*\[0, 16\)"):
        make_metadata([row], 16)


def test_an_empty_batch_is_rejected() -> None:
    with pytest.raises(ValueError, match="rows"):
        make_metadata([], 16)


def test_logits_of_the_wrong_shape_are_rejected() -> None:
    metadata = make_metadata([make_row(), make_row()], 16)
    with pytest.raises(ValueError, match=r"logits.*\[2, 16\]"):
        Sampler()(torch.zeros(2, 17), metadata)

