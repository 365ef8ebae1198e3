"""The torch backend with a sliding window and logit soft-capping, against the paged reference
(strand/kernels/paged_attention_ref.py) on a random paged cache: decodes, fresh prefills and chunks on
cached context in one step, with the C++ kernels allowed and not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from strand.engine_core.model_executor.attention.backend import AttentionMetadata
from strand.engine_core.model_executor.attention.metadata_builder import build_attention_metadata
from strand.engine_core.model_executor.attention.torch_ref import TorchAttentionBackend
from strand.kernels.paged_attention_ref import paged_attention_ref

BLOCK_SIZE = 4
SCALE = 0.3
# A decode of 21, a fresh 11-token prompt, a 6-token chunk on 14 cached, a decode of 3.
QUERY_LENS = [1, 11, 6, 1]
SEQ_LENS = [21, 11, 20, 3]


def make_case(seed: int = 0, query_lens: list[int] = QUERY_LENS,
              seq_lens: list[int] = SEQ_LENS) -> tuple[torch.Tensor, torch.Tensor,
                                                        AttentionMetadata]:
    g = torch.Generator().manual_seed(seed)
    num_blocks = 1 + sum(-(-s // BLOCK_SIZE) for s in seq_lens)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, 2, 8, generator=g)
    perm = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    table = np.zeros((len(seq_lens), max(-(-s // BLOCK_SIZE) for s in seq_lens)), np.int32)
    slots = []
    for r, (ql, sl) in enumerate(zip(query_lens, seq_lens, strict=True)):
        table[r, :-(-sl // BLOCK_SIZE)] = [perm.pop() for _ in range(-(-sl // BLOCK_SIZE))]
        pos = np.arange(sl - ql, sl)
        slots.append(table[r, pos // BLOCK_SIZE].astype(np.int64) * BLOCK_SIZE + pos % BLOCK_SIZE)
    md = build_attention_metadata(np.array(query_lens), np.array(seq_lens), np.concatenate(slots),
                                  table, BLOCK_SIZE, torch.device("cpu"))
    q = torch.randn(sum(query_lens), 4, 8, generator=g)
    return q, cache, md


def run_backend(backend: TorchAttentionBackend, q: torch.Tensor, cache: torch.Tensor,
                md: AttentionMetadata, **kwargs: object) -> torch.Tensor:
    # The new tokens' K/V are what the cache already holds at their slots: the write is a no-op.
    flat = cache.view(2, -1, 2, 8)
    k, v = flat[0, md.slot_mapping].clone(), flat[1, md.slot_mapping].clone()
    return backend.forward(q, k, v, cache, md, SCALE, **kwargs)  # type: ignore[arg-type]


def reference(q: torch.Tensor, cache: torch.Tensor, md: AttentionMetadata,
              **kwargs: object) -> torch.Tensor:
    return paged_attention_ref(q, cache, md.query_start_loc, md.seq_lens, md.block_table,
                               SCALE, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("use_cpu_kernel", [True, False])
@pytest.mark.parametrize("window", [1, 5, 13])
def test_sliding_window_matches_reference(window: int, use_cpu_kernel: bool) -> None:
    q, cache, md = make_case(window)
    out = run_backend(TorchAttentionBackend(use_cpu_kernel), q, cache, md, sliding_window=window)
    expected = reference(q, cache, md, sliding_window=window)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(expected, reference(q, cache, md), atol=1e-3)


@pytest.mark.parametrize("window", [None, 6])
def test_softcap_matches_reference(window: int | None) -> None:
    q, cache, md = make_case(7)
    kwargs = {"sliding_window": window, "logit_softcap": 0.7}
    out = run_backend(TorchAttentionBackend(), q, cache, md, **kwargs)
    expected = reference(q, cache, md, sliding_window=window, softcap=0.7)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(expected, reference(q, cache, md, sliding_window=window),
                              atol=1e-3)


def test_window_past_every_context_is_plain_causal_attention() -> None:
    q, cache, md = make_case(3)
    out = run_backend(TorchAttentionBackend(), q, cache, md, sliding_window=max(SEQ_LENS))
    torch.testing.assert_close(out, reference(q, cache, md), atol=1e-5, rtol=1e-5)


def test_layers_of_different_windows_in_one_step_each_get_their_own_mask() -> None:
    # Gemma interleaves sliding and global layers over the same metadata: plans must not mix.
    q, cache, md = make_case(4)
    backend = TorchAttentionBackend()
    for window in (5, None, 5, 9, None):
        out = run_backend(backend, q, cache, md, sliding_window=window)
        torch.testing.assert_close(out, reference(q, cache, md, sliding_window=window),
                                   atol=1e-5, rtol=1e-5)


def test_window_below_one_is_rejected() -> None:
    q, cache, md = make_case(0)
    with pytest.raises(ValueError, match="sliding_window must be >= 1"):
        run_backend(TorchAttentionBackend(), q, cache, md, sliding_window=0)


@pytest.mark.parametrize("use_cpu_kernel", [True, False])
def test_grouped_requests_gather_from_the_earliest_window_start(use_cpu_kernel: bool) -> None:
    # Decodes of 17 and 30 (one length bucket, one group) and chunks of 5 on 20 and 24 cached:
    # the gather starts at the block of the earliest visible key of each group, not at 0.
    q, cache, md = make_case(9, [1, 1, 5, 5], [17, 30, 25, 29])
    out = run_backend(TorchAttentionBackend(use_cpu_kernel), q, cache, md, sliding_window=6)
    torch.testing.assert_close(out, reference(q, cache, md, sliding_window=6),
                               atol=1e-5, rtol=1e-5)
