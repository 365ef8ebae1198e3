"""The torch attention backend against a per-request dense reference, on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from strand.engine_core.model_executor.attention.metadata_builder import build_attention_metadata
from strand.engine_core.model_executor.attention.torch_ref import TorchAttentionBackend

CPU = torch.device("cpu")
BLOCK_SIZE = 4


def _reference(q, k_ctx, v_ctx, query_lens, seq_lens, scale):
    """Loop over requests; dense softmax attention with explicit causal positions."""
    out, start = [], 0
    group = q.shape[1] // k_ctx[0].shape[1]
    for r, (ql, sl) in enumerate(zip(query_lens, seq_lens, strict=True)):
        qr = q[start:start + ql].double().transpose(0, 1)  # [heads, ql, d]
        kr = k_ctx[r].double().repeat_interleave(group, 1).transpose(0, 1)  # [heads, sl, d]
        vr = v_ctx[r].double().repeat_interleave(group, 1).transpose(0, 1)
        scores = qr @ kr.transpose(1, 2) * scale
        q_pos = torch.arange(sl - ql, sl).unsqueeze(1)
        scores = scores.masked_fill(torch.arange(sl).unsqueeze(0) > q_pos, float("-inf"))
        out.append((scores.softmax(-1) @ vr).transpose(0, 1))
        start += ql
    return torch.cat(out)


def _run(query_lens, seq_lens, num_heads=4, num_kv_heads=2, head_dim=8,
         dtype=torch.float32, seed=0, use_cpu_kernel=True):
    g = torch.Generator().manual_seed(seed)
    num_blocks = 1 + sum(-(-s // BLOCK_SIZE) for s in seq_lens) + 3
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=g).to(dtype)
    # Each request gets shuffled, non-contiguous blocks (block 0 never used).
    perm = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    width = max(-(-s // BLOCK_SIZE) for s in seq_lens)
    table = np.zeros((len(seq_lens), width + 2), dtype=np.int32)
    k_ctx, v_ctx, slots = [], [], []
    new_k, new_v = [], []
    for r, (ql, sl) in enumerate(zip(query_lens, seq_lens, strict=True)):
        nb = -(-sl // BLOCK_SIZE)
        table[r, :nb] = [perm.pop() for _ in range(nb)]
        pos = np.arange(sl)
        req_slots = table[r, pos // BLOCK_SIZE].astype(np.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        flat = cache.view(2, -1, num_kv_heads, head_dim)
        k = flat[0, torch.from_numpy(req_slots)].clone()
        v = flat[1, torch.from_numpy(req_slots)].clone()
        # The new tokens' K/V arrive with the call (the cache holds stale values there).
        k[sl - ql:] = torch.randn(ql, num_kv_heads, head_dim, generator=g).to(dtype)
        v[sl - ql:] = torch.randn(ql, num_kv_heads, head_dim, generator=g).to(dtype)
        k_ctx.append(k)
        v_ctx.append(v)
        new_k.append(k[sl - ql:])
        new_v.append(v[sl - ql:])
        slots.append(req_slots[sl - ql:])
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=g).to(dtype)
    md = build_attention_metadata(np.array(query_lens), np.array(seq_lens),
                                  np.concatenate(slots), table, BLOCK_SIZE, CPU)
    out = TorchAttentionBackend(use_cpu_kernel).forward(q, torch.cat(new_k), torch.cat(new_v), cache, md,
                                          scale=head_dim**-0.5)
    ref = _reference(q, k_ctx, v_ctx, query_lens, seq_lens, head_dim**-0.5)
    return out, ref, cache, md, torch.cat(new_k)


@pytest.mark.parametrize(("query_lens", "seq_lens"), [
    ([1, 1, 1], [5, 17, 9]),  # all decode
    ([7, 13], [7, 13]),  # fresh prefills
    ([5, 1, 3, 1], [12, 30, 3, 1]),  # chunk after context, decodes, short prefill, first token
    # prefills of very different lengths land in separate buckets, interleaved with decodes
    ([2, 40, 9, 1, 70, 3, 1], [2, 100, 9, 33, 70, 50, 4]),
])
@pytest.mark.parametrize("use_cpu_kernel", [True, False], ids=["cpu-kernels", "gather-sdpa"])
def test_matches_dense_reference(query_lens: list[int], seq_lens: list[int],
                                 use_cpu_kernel: bool) -> None:
    out, ref, *_ = _run(query_lens, seq_lens, use_cpu_kernel=use_cpu_kernel)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_grouped_query_attention_with_one_kv_head() -> None:
    out, ref, *_ = _run([3, 1], [6, 9], num_heads=8, num_kv_heads=1)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_bfloat16_stays_close_to_the_reference() -> None:
    out, ref, *_ = _run([4, 1, 1], [9, 20, 3], dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, rtol=3e-2, atol=3e-2)


def test_new_keys_and_values_are_written_at_their_slots() -> None:
    _, _, cache, md, new_k = _run([2, 1], [6, 4])
    flat = cache.view(2, -1, cache.shape[3], cache.shape[4])
    assert torch.equal(flat[0, md.slot_mapping], new_k)


def test_a_block_table_the_kernels_would_read_past_is_refused() -> None:
    # The C++ kernels trust the table; a bad one must fail loudly, not read outside the pool.
    from strand.engine_core.model_executor.attention.torch_ref import check_block_table

    md = build_attention_metadata(np.array([2, 1]), np.array([5, 9]), np.array([4, 5, 36]),
                                  np.array([[1, 2, 0], [3, 4, 9]], dtype=np.int32), 4, CPU)
    check_block_table(md, num_blocks=10)  # fine
    with pytest.raises(ValueError, match=r"block_table entries must be in \[0, 9\)"):
        check_block_table(md, num_blocks=9)
    short = build_attention_metadata(np.array([1]), np.array([13]), np.array([12]),
                                     np.array([[1, 2, 3]], dtype=np.int32), 4, CPU)
    with pytest.raises(ValueError, match="block_table covers 12 tokens per request, seq_lens "
                                         "reach 13"):
        check_block_table(short, num_blocks=10)


@pytest.mark.parametrize(("query_lens", "seq_lens"), [
    ([19], [19]),  # one fresh prompt: the whole step
    ([7, 1, 13, 5], [7, 30, 13, 12]),  # fresh prompts beside a decode and a chunk after context
])
def test_bfloat16_fresh_prefills_through_sdpa_match_the_reference(
        query_lens: list[int], seq_lens: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    # Forced on: on a CPU without oneDNN bfloat16 (AVX2) the backend keeps them on the kernel.
    from strand.engine_core.model_executor.attention import torch_ref

    calls: list[int] = []
    real = torch_ref.fresh_prefill_attention

    def spy(q: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(q.shape[0])
        return real(q, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(torch_ref, "fresh_sdpa_applies",
                        lambda dtype, head_dim: dtype == torch.bfloat16)
    monkeypatch.setattr(torch_ref, "fresh_prefill_attention", spy)
    out, ref, *_ = _run(query_lens, seq_lens, num_heads=6, num_kv_heads=2, head_dim=16,
                        dtype=torch.bfloat16)
    assert calls == [q for q, s in zip(query_lens, seq_lens, strict=True) if q == s and q > 1]
    torch.testing.assert_close(out.double(), ref, rtol=3e-2, atol=3e-2)
    out32, ref32, *_ = _run(query_lens, seq_lens, num_heads=6, num_kv_heads=2, head_dim=16)
    assert len(calls) == sum(q == s and q > 1 for q, s in zip(query_lens, seq_lens, strict=True))
    torch.testing.assert_close(out32.double(), ref32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("vendor", "dtype", "sdpa"), [
    ("GenuineIntel", torch.bfloat16, True), ("AuthenticAMD", torch.bfloat16, False),
    ("GenuineIntel", torch.float32, False)])
def test_only_intel_cpus_without_amx_send_bfloat16_fresh_prefills_to_sdpa(
        monkeypatch: pytest.MonkeyPatch, vendor: str, dtype: torch.dtype, sdpa: bool) -> None:
    # torch's bfloat16 SDPA took several times the C++ kernel's time for a SmolLM2 layer on an
    # AMD CPU with AVX-512 BF16; on an Intel CPU with AVX-512 BF16 (no AMX) it was the faster.
    from strand.engine_core.model_executor.attention import torch_ref
    from strand.platform.cpu_isa import CpuIsa

    isa = CpuIsa(machine="x86_64", detected="avx512", level="avx512",
                 flags=frozenset({"avx512f", "avx512_bf16"}), vendor=vendor)
    monkeypatch.setattr(torch_ref, "probe", lambda: isa)
    monkeypatch.setattr(torch_ref, "cpu_prefill_amx_applies", lambda dtype, head_dim: False)
    assert torch_ref.fresh_sdpa_applies(dtype, 64) is sdpa
