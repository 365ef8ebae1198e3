"""The weights a decode step reads (the few-row kernel's, or float32 panels that are their
layer's only copy) gathered into one block of 2 MiB pages
(strand/engine_core/model_executor/layers/weight_arena.py): the same values, shapes and parameters, in a
decode step's read order, the same outputs; the block is 2 MiB aligned and eligible for huge
pages where the kernel offers them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core.model_executor.layers import weight_arena
from strand.engine_core.model_executor.layers.linear import Linear, pack_linear_weights
from strand.engine_core.model_executor.loader import load_model
from strand.engine_core.model_executor.model_config import load_model_config
from strand.kernels import cpu_linear
from strand.testing.tiny_model import make_tiny_model


def _thp_eligible(t: torch.Tensor) -> bool | None:
    """THPeligible of the mapping holding t (/proc/self/smaps); None if not readable."""
    address, inside = t.data_ptr(), False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split()
                if head and "-" in head[0] and not head[0].endswith(":"):
                    lo, hi = (int(a, 16) for a in head[0].split("-"))
                    inside = lo <= address < hi
                elif inside and head[:1] == ["THPeligible:"]:
                    return head[1] == "1"
    except OSError:
        return None
    return None


def _thp_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text.split("[")[1].split("]")[0] if "[" in text else None


def test_a_block_is_2mib_aligned_zeroed_and_advised_for_huge_pages() -> None:
    block = weight_arena.huge_page_block(5 << 20)
    assert block.numel() == 5 << 20 and block.dtype == torch.uint8
    assert block.data_ptr() % weight_arena.HUGE_PAGE == 0
    assert int(block[::4096].sum()) == 0
    block[-1] = 7  # writable to its last byte
    if _thp_mode() in ("always", "madvise"):
        assert _thp_eligible(block) is True
    with pytest.raises(ValueError, match="nbytes"):
        weight_arena.huge_page_block(0)


def _read_by_decode(m: Linear) -> torch.Tensor | None:
    """The copy of m's weight a decode step reads: dense for the few-row kernel, or float32
    panels that are the layer's only copy."""
    return m.weight if m.small_m else m.packed if m.panels_only else None


def _distinct(tensors: list[torch.Tensor | None]) -> list[torch.Tensor]:
    return [t for t in dict.fromkeys(tensors) if t is not None]


@pytest.mark.skipif(not cpu_linear.small_m_applies(torch.empty(4, 4)),
                    reason="CPU kernels not built")
@pytest.mark.parametrize("keep_dense", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_gathered_weights_keep_values_parameters_and_outputs(
        tmp_path: Path, tied: bool, keep_dense: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAND_KEEP_DENSE_WEIGHTS", "1" if keep_dense else "0")
    model_dir = make_tiny_model(tmp_path / "m", tie_word_embeddings=tied)
    model = load_model(load_model_config(str(model_dir), "float32"), torch.device("cpu"))
    pack_linear_weights(model)
    linears = [m for m in model.modules()
               if isinstance(m, Linear) and _read_by_decode(m) is not None]
    read = _distinct([_read_by_decode(m) for m in linears])  # module order, each once
    assert read, "nothing a decode step reads"
    values = [t.detach().clone() for t in read]
    params = [m.weight for m in linears if m.small_m]
    ids = torch.tensor([[1], [5], [9]])
    with torch.inference_mode():
        before = [model.compute_logits(model.model.embed_tokens(i)) for i in ids]
    total = weight_arena.gather_decode_weights(model)
    assert total >= sum(t.numel() * 4 for t in read)
    moved = _distinct([_read_by_decode(m) for m in linears])
    starts = [t.data_ptr() for t in moved]
    assert starts == sorted(starts)  # the read order: layer by layer, the lm_head last
    assert starts[0] % weight_arena.HUGE_PAGE == 0
    assert starts[-1] - starts[0] < total
    for m in linears:  # a dense weight stays the same Parameter, only its data moved
        assert not m.small_m or any(m.weight is p for p in params)
    for t, v in zip(moved, values, strict=True):
        assert torch.equal(t, v)
    lm_head: Any = model.lm_head
    assert (lm_head.weight is model.model.embed_tokens.weight) == tied
    with torch.inference_mode():  # one row a call, on the moved weights
        after = [model.compute_logits(model.model.embed_tokens(i)) for i in ids]
    for a, b in zip(after, before, strict=True):
        assert torch.equal(a, b)


def test_switched_off_nothing_moves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAND_HUGE_PAGE_WEIGHTS", "0")
    model_dir = make_tiny_model(tmp_path / "m")
    model = load_model(load_model_config(str(model_dir), "float32"), torch.device("cpu"))
    pack_linear_weights(model)
    before = [p.data_ptr() for p in model.parameters()]
    assert weight_arena.gather_decode_weights(model) == 0
    assert [p.data_ptr() for p in model.parameters()] == before
