"""RMSNorm (+ residual), silu-and-mul and rotary embedding on CPU in one pass each (C++).

Between a layer's matmuls torch runs about a dozen elementwise ops per layer, each a pass over
[num_tokens, hidden]; on the 2-core CPU they were 8% of a standard-workload run once the
matmuls went to oneDNN. Also here: the KV cache write by slot and the greedy argmax.
The C++ is strand/kernels/csrc/elementwise.cpp: float32, and bfloat16 rounded after each op exactly
where HF's bfloat16 ops round (callers keep the torch path for other dtypes). References:
strand/kernels/rms_norm_ref.py, strand/kernels/rotary_ref.py and `F.silu(gate) * up`;
tests/kernels/test_cpu_elementwise.py compares them.
"""

from __future__ import annotations

import torch

from strand.kernels._cpu_build import KERNELS as _EXTENSION


def is_available() -> bool:
    """Builds (once, with the other CPU kernels) on the first call."""
    return _EXTENSION.module() is not None


def unavailable_reason() -> str | None:
    return _EXTENSION.unavailable_reason()


_DTYPES = (torch.float32, torch.bfloat16)


def applies(*tensors: torch.Tensor) -> bool:
    """Whether these kernels take tensors like these (on CPU, all float32 or all bfloat16) and
    are built."""
    dtype = tensors[0].dtype
    if dtype not in _DTYPES:
        return False
    for t in tensors:  # a loop, not generators: this runs some 100 times a decode step
        if t.dtype != dtype or t.device.type != "cpu":
            return False
    return is_available()


def _rounds_into_bfloat16(key: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """float32 rows into a bfloat16 cache (kv_cache_dtype="bfloat16" under float32 weights)."""
    return key.dtype == torch.float32 and kv_cache.dtype == torch.bfloat16


def writes_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether write_kv takes these: all of one dtype (applies()), or float32 rows into a
    bfloat16 cache, rounded as .to(torch.bfloat16) rounds."""
    if _rounds_into_bfloat16(key, kv_cache):
        return applies(key, value) and kv_cache.device.type == "cpu"
    return applies(key, value, kv_cache)


def _module():  # type: ignore[no-untyped-def]
    module = _EXTENSION.module()
    if module is None:
        raise RuntimeError(f"CPU elementwise kernels unavailable: {unavailable_reason()}")
    return module


def _check_float32(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.float32 or t.device.type != "cpu":
            raise ValueError(f"{name} must be float32 on CPU, got {t.dtype} on {t.device}")


def _check_same(**tensors: torch.Tensor) -> None:
    """All on CPU, all float32 or all bfloat16."""
    first = next(iter(tensors.values())).dtype
    for name, t in tensors.items():
        if t.dtype not in _DTYPES or t.dtype != first or t.device.type != "cpu":
            raise ValueError(f"{name} must be float32 or bfloat16 on CPU, in the dtype of "
                             f"{next(iter(tensors))} ({first}); got {t.dtype} on {t.device}")


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden], rows may be strided
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden]
    in_place: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Without residual: the normed x. With it: (norm(x + residual), x + residual); in_place
    (x and residual contiguous, neither needed by the caller afterwards) writes the norm into
    x's storage and the sum into residual's. A row is read whole before it is written, so the
    values are the same; what changes is where the stores go: into lines the kernel just read
    rather than fresh buffers (float32, SmolLM2's 60 norms of 512 x 576 between GEMMs, one
    thread: less than half the time)."""
    _check_same(x=x, weight=weight)
    if x.dim() != 2 or x.stride(1) != 1 or weight.shape != (x.shape[1],):
        raise ValueError(f"x must be [num_tokens, hidden] with unit last stride and weight "
                         f"[hidden]; got {tuple(x.shape)} and {tuple(weight.shape)}")
    weight = weight.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype)
    if residual is None:
        _module().rms_norm(out, x, weight, float(eps))
        return out
    _check_same(x=x, residual=residual)
    if residual.shape != x.shape:
        raise ValueError(f"residual must be {tuple(x.shape)}, got {tuple(residual.shape)}")
    if in_place and x.is_contiguous() and residual.is_contiguous():
        out, new_residual = x, residual
    else:
        new_residual = torch.empty_like(out)
    _module().add_rms_norm(out, new_residual, x, residual.contiguous(), weight, float(eps))
    return out, new_residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * n] -> [.., n]
    """silu(gate_up[:, :n]) * gate_up[:, n:], the gated MLP's activation."""
    _check_same(gate_up=gate_up)
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be [num_tokens, 2 * n], got {tuple(gate_up.shape)}")
    gate_up = gate_up.contiguous()
    out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype)
    _module().silu_and_mul(out, gate_up)
    return out


def rotary_neox_(
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin: torch.Tensor,  # [max_positions, rot_dim] float32: cos | sin
    *heads: torch.Tensor,  # each [num_tokens, n, head_dim] float32/bfloat16, rotated in place
) -> None:
    """Rotates the first rot_dim dims of every head of each tensor by position (NeoX halves, as
    HF Llama). q and k go in one call so the positions are checked once per layer."""
    _check_float32(cos_sin=cos_sin)
    rot_dim = cos_sin.shape[1]
    if cos_sin.dim() != 2 or rot_dim % 2:
        raise ValueError(f"cos_sin must be [max_positions, rot_dim] with even rot_dim, got "
                         f"{tuple(cos_sin.shape)}")
    if positions.dim() != 1:
        raise ValueError(f"positions must be [num_tokens], got {tuple(positions.shape)}")
    # The C++ indexes the table unchecked; torch's path would raise on such a position.
    if positions.numel():
        low, high = int(positions.min()), int(positions.max())
        if low < 0 or high >= len(cos_sin):
            raise ValueError(f"positions must be in [0, {len(cos_sin)}), got {low}..{high}")
    for x in heads:
        _check_same(x=x)
        if x.dim() != 3 or x.stride(2) != 1 or x.shape[0] != positions.shape[0]:
            raise ValueError(f"x must be [num_tokens={positions.shape[0]}, heads, head_dim] with "
                             f"unit last stride, got shape {tuple(x.shape)} strides {x.stride()}")
        if rot_dim > x.shape[2]:
            raise ValueError(f"cos_sin's rot_dim ({rot_dim}) must be <= head_dim ({x.shape[2]})")
    positions, cos_sin = positions.to(torch.int64).contiguous(), cos_sin.contiguous()
    for x in heads:
        _module().rotary_neox(x, positions, cos_sin)


def write_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]; tokens may be strided
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]; tokens may be strided
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64: block * block_size + offset; < 0 skipped
) -> None:
    """Each token's key and value into its cache slot (index_copy_ by slot, in one pass). The
    cache is in the rows' dtype, or bfloat16 under float32 rows (writes_kv())."""
    if _rounds_into_bfloat16(key, kv_cache):
        _check_float32(key=key, value=value)
    else:
        _check_same(key=key, value=value, kv_cache=kv_cache)
    row = kv_cache.shape[3:]
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3 or t.shape[1:] != row or t[0].stride() != (row[1], 1):
            raise ValueError(f"{name} must be [num_tokens, {row[0]}, {row[1]}] with dense "
                             f"token rows, got shape {tuple(t.shape)} strides {t.stride()}")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous")
    slots = slot_mapping.to(torch.int64).contiguous()
    if slots.shape != (key.shape[0],) or value.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping must be [num_tokens={key.shape[0]}], got "
                         f"{tuple(slots.shape)}")
    num_slots = kv_cache.shape[1] * kv_cache.shape[2]
    if slots.numel() and int(slots.max()) >= num_slots:
        raise ValueError(f"slot_mapping must be < {num_slots} (the cache's slots), got "
                         f"{int(slots.max())}")
    _module().write_kv(kv_cache[0], kv_cache[1], key, value, slots)


def argmax(logits: torch.Tensor) -> torch.Tensor:  # [num_reqs, vocab] -> [num_reqs] int64
    """logits.argmax(dim=-1): the first maximum of each row, NaN counting as the maximum."""
    _check_float32(logits=logits)
    if logits.dim() != 2 or logits.stride(1) != 1 or logits.shape[1] == 0:
        raise ValueError(f"logits must be [num_reqs, vocab > 0] with unit last stride, got "
                         f"{tuple(logits.shape)}")
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    _module().argmax(out, logits)
    return out
