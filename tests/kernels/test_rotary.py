"""Triton rotary embedding against the torch reference (and the reference against HF)."""

from __future__ import annotations

import pytest
import torch

from strand.kernels.rotary import apply_rotary
from strand.kernels.rotary_ref import apply_rotary_ref
from tests.kernels.conftest import DEVICE, DTYPES, assert_close


def cos_sin_cache(max_position: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[max_position, rot_dim]: cos of every frequency, then sin."""
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(DEVICE)


def qk(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
       seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    return q, k


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize(
    ("num_tokens", "num_heads", "num_kv_heads", "head_dim", "rot_dim"),
    [(1, 4, 4, 32, 32), (9, 8, 2, 64, 64), (5, 6, 3, 64, 32), (4, 4, 1, 40, 40)],
)
def test_kernel_matches_reference(
    num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, rot_dim: int,
    is_neox: bool, dtype: torch.dtype,
) -> None:
    q, k = qk(num_tokens, num_heads, num_kv_heads, head_dim, dtype, seed=num_tokens)
    positions = torch.randint(0, 500, (num_tokens,), device=DEVICE)
    cache = cos_sin_cache(512, rot_dim)
    q_out, k_out = apply_rotary(q, k, positions, cache, is_neox)
    q_ref, k_ref = apply_rotary_ref(q, k, positions, cache, is_neox)
    assert_close(q_out, q_ref, dtype)
    assert_close(k_out, k_ref, dtype)


def test_partial_rotary_copies_the_unrotated_dims() -> None:
    q, k = qk(3, 4, 2, 64, torch.float32, seed=1)
    q_out, k_out = apply_rotary(q, k, torch.tensor([1, 2, 3], device=DEVICE), cos_sin_cache(8, 16))
    assert torch.equal(q_out[..., 16:], q[..., 16:]) and torch.equal(k_out[..., 16:], k[..., 16:])
    assert not torch.allclose(q_out[..., :16], q[..., :16])


def test_position_zero_is_the_identity() -> None:
    q, k = qk(2, 4, 2, 32, torch.float32, seed=2)
    q_out, k_out = apply_rotary(q, k, torch.zeros(2, dtype=torch.long, device=DEVICE),
                                cos_sin_cache(4, 32))
    assert torch.equal(q_out, q) and torch.equal(k_out, k)


def test_inputs_are_not_modified() -> None:
    q, k = qk(3, 4, 2, 32, torch.float32, seed=3)
    q_before, k_before = q.clone(), k.clone()
    apply_rotary(q, k, torch.tensor([5, 6, 7], device=DEVICE), cos_sin_cache(8, 32))
    assert torch.equal(q, q_before) and torch.equal(k, k_before)


def test_reference_neox_matches_hf_llama() -> None:
    modeling_llama = pytest.importorskip(
        "transformers.models.llama.modeling_llama", reason="transformers is the test oracle")
    q, k = qk(6, 4, 2, 32, torch.float32, seed=4)
    positions = torch.tensor([0, 3, 7, 100, 101, 255], device=DEVICE)
    cache = cos_sin_cache(256, 32)
    cos_half, sin_half = cache[positions].chunk(2, dim=-1)
    cos, sin = torch.cat([cos_half] * 2, -1), torch.cat([sin_half] * 2, -1)  # HF: [T, head_dim]
    # HF wants [batch, heads, seq, head_dim]; our tokens are its seq.
    q_hf, k_hf = modeling_llama.apply_rotary_pos_emb(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
        cos.unsqueeze(0), sin.unsqueeze(0))
    q_ref, k_ref = apply_rotary_ref(q, k, positions, cache, is_neox=True)
    torch.testing.assert_close(q_ref, q_hf[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k_ref, k_hf[0].transpose(0, 1), atol=1e-6, rtol=1e-6)


def test_reference_gptj_is_a_complex_rotation_of_adjacent_pairs() -> None:
    q, k = qk(4, 2, 2, 32, torch.float32, seed=5)
    positions = torch.tensor([1, 9, 30, 63], device=DEVICE)
    cache = cos_sin_cache(64, 32)
    cos, sin = cache[positions].chunk(2, dim=-1)
    rotation = torch.complex(cos, sin).unsqueeze(1)  # [T, 1, 16]
    expected = torch.view_as_real(torch.view_as_complex(q.reshape(4, 2, 16, 2)) * rotation)
    q_ref, _ = apply_rotary_ref(q, k, positions, cache, is_neox=False)
    torch.testing.assert_close(q_ref, expected.reshape(4, 2, 32), atol=1e-6, rtol=1e-6)


def test_odd_rot_dim_is_rejected() -> None:
    q, k = qk(1, 2, 2, 32, torch.float32, seed=6)
    with pytest.raises(ValueError, match="rot_dim"):
        apply_rotary(q, k, torch.zeros(1, dtype=torch.long, device=DEVICE),
                     torch.zeros(4, 15, device=DEVICE))
