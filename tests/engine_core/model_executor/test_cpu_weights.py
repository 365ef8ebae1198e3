"""One resident copy of each weight on CPU (strand/engine_core/model_executor/layers/cpu_weights.py):
after loading, float32 linear weights live only as panels, a tied embedding table is read from
its head's panels, and the model computes what it did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core.model_executor.layers import weight_arena
from strand.engine_core.model_executor.layers.cpu_weights import prepare_cpu_weights
from strand.engine_core.model_executor.layers.embedding import PanelEmbedding
from strand.engine_core.model_executor.layers.linear import Linear
from strand.engine_core.model_executor.loader import load_model
from strand.engine_core.model_executor.model_config import load_model_config
from strand.kernels import cpu_linear_panels, cpu_linear_panels_bf16
from strand.testing.tiny_model import make_tiny_model

pytestmark = pytest.mark.skipif(not cpu_linear_panels.chosen(),
                                reason="no float32 panels on this CPU level")


def _kept_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct tensors a model holds: parameters, buffers, packed copies."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        for t in [*module.parameters(recurse=False), *module.buffers(recurse=False),
                  getattr(module, "packed", None)]:
            if isinstance(t, torch.Tensor) and not t.is_meta and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tied", [False, True])
def test_each_weight_is_kept_once_and_the_model_computes_what_it_did(tmp_path: Path,
                                                                      tied: bool,
                                                                      dtype: str) -> None:
    if dtype == "bfloat16" and not cpu_linear_panels_bf16.chosen():
        pytest.skip("no bfloat16 panels on this CPU level")
    model_dir = make_tiny_model(tmp_path / "m", tie_word_embeddings=tied)
    model = load_model(load_model_config(str(model_dir), dtype), torch.device("cpu"))
    loaded = _kept_bytes(model)
    ids = torch.tensor([[1], [5], [9], [0]])
    with torch.inference_mode():
        before = [model.compute_logits(model.model.embed_tokens(i)) for i in ids]
        batch_before = model.compute_logits(model.model.embed_tokens(ids[:, 0]))
    prepare_cpu_weights(model)
    # Panels pad each weight's rows to whole panels; nothing else is added.
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    padding = sum((m.packed.numel() - m.out_features * m.in_features) * m.packed.element_size()
                  for m in linears if m.packed is not None)
    assert all(m.panels_only for m in linears)
    assert _kept_bytes(model) == loaded + padding
    embed: Any = model.model.embed_tokens
    assert isinstance(embed, PanelEmbedding) == tied
    with torch.inference_mode():
        after = [model.compute_logits(model.model.embed_tokens(i)) for i in ids]
        batch_after = model.compute_logits(model.model.embed_tokens(ids[:, 0]))
    # bfloat16: the panels' float32 sums in another order than torch's, one rounding each.
    tol = 1e-5 if dtype == "float32" else 2e-2
    for a, b in zip(after, before, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(batch_after.float(), batch_before.float(), rtol=tol, atol=tol)


def test_the_panel_embedding_gives_the_tables_rows_and_refuses_ids_outside_it() -> None:
    table = torch.randn(100, 24)
    head = Linear(24, 100, bias=False)
    with torch.no_grad():
        head.weight.copy_(table)
    head.pack(keep_dense=True)  # the table's owner keeps it; the panels are built beside
    embed = PanelEmbedding(head, 100)
    ids = torch.tensor([[0, 99, 47], [48, 3, 3]])
    assert torch.equal(embed(ids), table[ids])
    with pytest.raises(IndexError, match=r"token ids must be in \[0, 100\), got 0..100"):
        embed(torch.tensor([0, 100]))
    with pytest.raises(ValueError, match="packed into panels"):
        PanelEmbedding(Linear(4, 4), 4)


def test_a_cpu_process_never_imports_triton(tmp_path: Path) -> None:
    """Importing Triton costs a CPU process tens of MB it never uses: loading a model and
    generating (float32 and GGUF-packed alike) must not import it."""
    import subprocess
    import sys

    model_dir = make_tiny_model(tmp_path / "m", tie_word_embeddings=True)
    script = (
        "import sys\n"
        "from strand import LLM, SamplingParams\n"
        f"llm = LLM(model={str(model_dir)!r}, dtype='float32', max_model_len=64,\n"
        "          kv_cache_memory=1 << 20)\n"
        "llm.generate([{'prompt_token_ids': [1, 2, 3]}], SamplingParams(max_tokens=4),\n"
        "             use_tqdm=False)\n"
        "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('triton.')))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(key + ":"))


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's peak RSS reset")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_large_tied_table_is_never_held_twice_while_packed_and_gathered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """The table is packed into its head's panels and then moved onto huge pages: each time
    the old copy's pages go as the new one fills, a slice at a time, so the peak passes one
    table by about a slice."""
    monkeypatch.setattr(cpu_linear_panels, "_RELEASE_EVERY", 4 << 20)
    monkeypatch.setattr(weight_arena, "_RELEASE_EVERY", 4 << 20)
    model_dir = make_tiny_model(tmp_path / "m", num_layers=1, hidden_size=128, num_heads=2,
                                num_kv_heads=1, vocab_size=131072, tie_word_embeddings=True)
    if dtype == "bfloat16" and not cpu_linear_panels_bf16.chosen():
        pytest.skip("no bfloat16 panels on this CPU level")
    model = load_model(load_model_config(str(model_dir), dtype), torch.device("cpu"))
    table_kib = 131072 * 128 * (4 if dtype == "float32" else 2) // 1024
    with torch.inference_mode():
        before = model.compute_logits(model.model.embed_tokens(torch.tensor([7, 131071])))
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM starts again from VmRSS
    resident = _status_kib("VmRSS")
    prepare_cpu_weights(model)
    assert isinstance(model.model.embed_tokens, PanelEmbedding)
    assert _status_kib("VmHWM") - resident < table_kib // 4
    with torch.inference_mode():
        after = model.compute_logits(model.model.embed_tokens(torch.tensor([7, 131071])))
    tol = 1e-5 if dtype == "float32" else 2e-2
    torch.testing.assert_close(after.float(), before.float(), rtol=tol, atol=tol)
