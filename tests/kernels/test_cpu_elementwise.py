"""The CPU elementwise kernels against their pure-torch references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from strand.kernels import cpu_elementwise
from strand.kernels.rms_norm_ref import rms_norm_ref
from strand.kernels.rotary_ref import apply_rotary_ref

pytestmark = pytest.mark.skipif(not cpu_elementwise.is_available(),
                                reason=f"CPU kernels not built: "
                                       f"{cpu_elementwise.unavailable_reason()}")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(("tokens", "hidden"), [(1, 16), (7, 512), (33, 100), (64, 2048)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_the_reference(tokens: int, hidden: int, with_residual: bool) -> None:
    g = _gen(tokens * hidden)
    x = torch.randn(tokens, hidden, generator=g) * 3
    weight = torch.randn(hidden, generator=g)
    residual = torch.randn(tokens, hidden, generator=g) if with_residual else None
    got = cpu_elementwise.rms_norm(x, weight, 1e-6, residual)
    want = rms_norm_ref(x, weight, 1e-6, residual)
    if residual is None:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert isinstance(got, tuple) and isinstance(want, tuple)
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(got[1], want[1])  # the sum is exact either way


def test_rms_norm_reads_strided_rows() -> None:
    wide = torch.randn(5, 96, generator=_gen(1))
    x = wide[:, :48]  # rows 96 apart
    weight = torch.randn(48, generator=_gen(2))
    torch.testing.assert_close(cpu_elementwise.rms_norm(x, weight, 1e-5),
                               rms_norm_ref(x, weight, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("tokens", "n"), [(1, 8), (5, 1024), (64, 37)])
def test_silu_and_mul_matches_torch(tokens: int, n: int) -> None:
    gate_up = torch.randn(tokens, 2 * n, generator=_gen(n)) * 10  # far into both tails
    gate_up[0, 0], gate_up[-1, n - 1] = -100.0, 100.0  # e^100 overflows: silu is -0 and 100
    gate, up = gate_up.chunk(2, dim=-1)
    got = cpu_elementwise.silu_and_mul(gate_up)
    assert got.shape == (tokens, n)
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("heads", "head_dim", "rot_dim"), [(8, 64, 64), (3, 40, 40),
                                                            (2, 128, 64), (1, 256, 256)])
def test_rotary_matches_the_reference(heads: int, head_dim: int, rot_dim: int) -> None:
    g = _gen(heads * head_dim)
    tokens, max_pos = 19, 300
    # q and k as the model has them: views into one fused projection (strided rows).
    qkv = torch.randn(tokens, (heads + 2) * head_dim, generator=g)
    q = qkv[:, :heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + 1) * head_dim].view(tokens, 1, head_dim)
    angles = torch.rand(max_pos, rot_dim // 2, generator=g) * 6.28
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.randint(0, max_pos, (tokens,), generator=g)
    want_q, want_k = apply_rotary_ref(q.clone(), k.clone(), positions, cos_sin)
    cpu_elementwise.rotary_neox_(positions, cos_sin, q, k)
    torch.testing.assert_close(q, want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k, want_k, rtol=1e-6, atol=1e-6)


def test_rotary_refuses_a_position_past_the_table() -> None:
    x = torch.zeros(2, 1, 8)
    with pytest.raises(ValueError, match=r"positions must be in \[0, 4\)"):
        cpu_elementwise.rotary_neox_(torch.tensor([0, 4]), torch.zeros(4, 8), x)


def test_rotary_refuses_heads_of_another_length_naming_the_bound() -> None:
    with pytest.raises(ValueError, match="num_tokens=2"):
        cpu_elementwise.rotary_neox_(torch.tensor([0, 1]), torch.zeros(4, 8), torch.zeros(3, 1, 8))


def test_other_dtypes_are_refused_naming_the_tensor() -> None:
    with pytest.raises(ValueError, match="gate_up must be float32 or bfloat16"):
        cpu_elementwise.silu_and_mul(torch.zeros(2, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="weight must be float32 or bfloat16 on CPU, in the "
                                         "dtype of x"):
        cpu_elementwise.rms_norm(torch.zeros(2, 4), torch.ones(4, dtype=torch.bfloat16), 1e-6)
    with pytest.raises(ValueError, match="logits must be float32"):
        cpu_elementwise.argmax(torch.zeros(2, 4, dtype=torch.bfloat16))
    assert not cpu_elementwise.applies(torch.zeros(2, dtype=torch.float16))
    assert not cpu_elementwise.applies(torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16))


@pytest.mark.parametrize("vocab", [1, 5, 16, 17, 33, 40, 47, 32000, 32003])
def test_argmax_matches_torch_with_ties_nan_and_inf(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(37, vocab, generator=g)
    assert torch.equal(cpu_elementwise.argmax(logits), logits.argmax(dim=-1))
    ties = torch.randint(0, 3, (37, vocab), generator=g).float()  # the first maximum wins
    assert torch.equal(cpu_elementwise.argmax(ties), ties.argmax(dim=-1))
    ties[::3, -1] = float("nan")  # NaN counts as the maximum, the first NaN wins
    ties[::5, 0] = float("nan")
    ties[1::4] = float("-inf")
    ties[2, vocab // 2] = float("inf")
    assert torch.equal(cpu_elementwise.argmax(ties), ties.argmax(dim=-1))
    strided = torch.randn(8, 2 * vocab, generator=g)[:, :vocab]  # rows of a wider tensor
    assert torch.equal(cpu_elementwise.argmax(strided), strided.argmax(dim=-1))


def test_write_kv_puts_each_token_at_its_slot_and_skips_padding() -> None:
    g = torch.Generator().manual_seed(5)
    kv = torch.full((2, 6, 4, 2, 16), float("nan"))
    qkv = torch.randn(5, 8, 16, generator=g)  # k, v as views of a fused projection
    key, value = qkv[:, 4:6], qkv[:, 6:8]
    slots = torch.tensor([9, 0, -1, 23, 4])
    cpu_elementwise.write_kv(key, value, kv, slots)
    flat = kv.view(2, -1, 2, 16)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(flat[0, slot], key[t]) and torch.equal(flat[1, slot], value[t])
    written = {s for s in slots.tolist() if s >= 0}
    untouched = [s for s in range(24) if s not in written]
    assert flat[:, untouched].isnan().all()  # the padding token (-1) wrote nowhere


def test_write_kv_refuses_a_slot_past_the_cache_naming_the_bound() -> None:
    kv = torch.zeros(2, 2, 4, 1, 16)
    row = torch.zeros(1, 1, 16)
    with pytest.raises(ValueError, match="slot_mapping must be < 8"):
        cpu_elementwise.write_kv(row, row, kv, torch.tensor([8]))
    with pytest.raises(ValueError, match=r"key must be \[num_tokens, 1, 16\]"):
        cpu_elementwise.write_kv(torch.zeros(1, 2, 16), row, kv, torch.tensor([0]))


# bfloat16: rounded where HF's bfloat16 ops round, so the kernels give torch's bits, but for
# RMSNorm's float32 sum of squares, whose order differs: it may move a result by one bfloat16
# step when the exact value sits near a rounding boundary.
def _within_one_bf16_step(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), rtol=2**-7, atol=1e-6)
    assert (got != ref).float().mean() < 0.01


@pytest.mark.parametrize(("tokens", "hidden"), [(7, 512), (64, 520), (3, 13)])
def test_bfloat16_rms_norm_gives_torchs_rounding(tokens: int, hidden: int) -> None:
    g = torch.Generator().manual_seed(tokens + hidden)
    x, residual = (torch.randn(tokens, hidden, generator=g).bfloat16() for _ in range(2))
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).bfloat16()
    expected = rms_norm_ref(x, weight, 1e-6)
    assert isinstance(expected, torch.Tensor)  # no residual: one tensor back
    got = cpu_elementwise.rms_norm(x, weight, 1e-6)
    assert isinstance(got, torch.Tensor)
    _within_one_bf16_step(got, expected)
    out, new_residual = cpu_elementwise.rms_norm(x, weight, 1e-6, residual)
    ref_out, ref_residual = rms_norm_ref(x, weight, 1e-6, residual)
    assert torch.equal(new_residual, ref_residual)  # one bfloat16 add: exact
    _within_one_bf16_step(out, ref_out)


@pytest.mark.parametrize(("tokens", "n"), [(5, 64), (33, 1000), (2, 7)])
def test_bfloat16_silu_and_mul_gives_torchs_bits(tokens: int, n: int) -> None:
    gate_up = torch.randn(tokens, 2 * n, generator=torch.Generator().manual_seed(n)).bfloat16()
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.equal(cpu_elementwise.silu_and_mul(gate_up), F.silu(gate) * up)


def test_bfloat16_silu_and_mul_gives_torchs_bits_for_every_bfloat16_gate() -> None:
    # All 65536 bit patterns, NaN and inf too. exp of a gate near -88.5 is finite but once
    # rounded its power of two past float32's exponent field (silu gave -0, torch -3e-37).
    gate = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    gate_up = torch.cat([gate, torch.ones_like(gate)]).reshape(1, -1)
    torch.testing.assert_close(cpu_elementwise.silu_and_mul(gate_up), F.silu(gate)[None],
                               rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(("head_dim", "rot_dim"), [(64, 64), (40, 40), (64, 32)])
def test_bfloat16_rotary_gives_the_torch_paths_bits(head_dim: int, rot_dim: int) -> None:
    g = torch.Generator().manual_seed(head_dim + rot_dim)
    positions = torch.randint(0, 100, (9,), generator=g)
    freqs = torch.outer(torch.arange(100.0), torch.rand(rot_dim // 2, generator=g))
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # float32, as the layer keeps it
    q = torch.randn(9, 4, head_dim, generator=g).bfloat16()
    # The layer's torch path: the table cast to bfloat16, every op in bfloat16.
    cos, sin = cos_sin[positions].bfloat16().unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = q[..., :rot_dim].chunk(2, dim=-1)
    expected = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, q[..., rot_dim:]], dim=-1)
    got = q.clone()
    cpu_elementwise.rotary_neox_(positions, cos_sin, got)
    assert torch.equal(got, expected)


def test_write_kv_copies_bfloat16_rows() -> None:
    kv = torch.zeros(2, 2, 4, 1, 16, dtype=torch.bfloat16)
    key, value = torch.randn(2, 1, 16).bfloat16(), torch.randn(2, 1, 16).bfloat16()
    cpu_elementwise.write_kv(key, value, kv, torch.tensor([5, 2]))
    flat = kv.view(2, -1, 1, 16)
    assert torch.equal(flat[0, 5], key[0]) and torch.equal(flat[1, 2], value[1])


def test_write_kv_rounds_float32_rows_into_a_bfloat16_cache_as_torch_does() -> None:
    # kv_cache_dtype="bfloat16" under float32 weights: the write is the cast, fused. A head_dim
    # of 40 has a tail past whole 16-value vectors; NaN and infinities keep their meaning.
    g = _gen(12)
    qkv = torch.randn(6, 6, 40, generator=g) * 100
    qkv[1, 2, 3], qkv[2, 3, 0], qkv[4, 2, 39] = float("nan"), float("inf"), float("-inf")
    key, value = qkv[:, 2:4], qkv[:, 4:6]  # strided token rows
    slots = torch.tensor([3, 0, -1, 17, 9, 8])
    kv = torch.zeros(2, 3, 8, 2, 40, dtype=torch.bfloat16)
    assert cpu_elementwise.writes_kv(key, value, kv)
    cpu_elementwise.write_kv(key, value, kv, slots)
    want = torch.zeros_like(kv)
    flat, keep = want.view(2, -1, 2, 40), slots >= 0
    flat[0, slots[keep]] = key[keep].bfloat16()
    flat[1, slots[keep]] = value[keep].bfloat16()
    assert torch.equal(kv.isnan(), want.isnan())
    assert torch.equal(torch.nan_to_num(kv), torch.nan_to_num(want))
    assert not cpu_elementwise.writes_kv(key.bfloat16(), value.bfloat16(), kv.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_in_place_stores_the_same_values_into_its_inputs(dtype: torch.dtype) -> None:
    g = _gen(11)
    x, residual = (torch.randn(37, 200, generator=g).to(dtype) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(200, generator=g)).to(dtype)
    want_out, want_residual = cpu_elementwise.rms_norm(x.clone(), weight, 1e-6, residual.clone())
    x_ptr, residual_ptr = x.data_ptr(), residual.data_ptr()
    out, new_residual = cpu_elementwise.rms_norm(x, weight, 1e-6, residual, in_place=True)
    assert (out.data_ptr(), new_residual.data_ptr()) == (x_ptr, residual_ptr)
    assert torch.equal(out, want_out) and torch.equal(new_residual, want_residual)


def test_rms_norm_in_place_leaves_a_strided_input_alone() -> None:
    g = _gen(12)
    wide = torch.randn(9, 96, generator=g)
    x, residual = wide[:, :48], torch.randn(9, 48, generator=g)  # x: rows 96 apart
    before = wide.clone()
    out, _ = cpu_elementwise.rms_norm(x, torch.ones(48), 1e-6, residual, in_place=True)
    assert torch.equal(wide, before) and out.data_ptr() != x.data_ptr()
    torch.testing.assert_close(out, rms_norm_ref(x, torch.ones(48), 1e-6, residual)[0],
                               rtol=1e-5, atol=1e-5)
