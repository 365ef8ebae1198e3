"""benchmarks/gguf_kernel.py: one tiny pass over packed layers, and its argument checks."""

from __future__ import annotations

import pytest
import torch

from benchmarks import gguf_kernel
from strand.kernels._cpu_build import KERNELS
from strand.kernels.gguf_linear_ref import Q4_1, dequantize_ref


@pytest.mark.skipif(KERNELS.module() is None, reason="CPU kernels unavailable")
@pytest.mark.parametrize("layout", ["tiles", "rows"])
def test_one_tiny_pass_reports_its_rate(layout: str, capsys: pytest.CaptureFixture[str]) -> None:
    gguf_kernel.main(["--layers", "1", "--hidden", "64", "--intermediate", "128", "--kv", "32",
                      "--rows", "2", "--repeats", "1", "--layout", layout])
    assert f"Q4_1 {layout} rows=2 threads=1" in capsys.readouterr().out


def test_random_blocks_are_finite_weights_of_a_models_size() -> None:
    w = dequantize_ref(gguf_kernel.random_blocks(8, 64, Q4_1, torch.Generator().manual_seed(0)),
                       Q4_1)
    assert w.shape == (8, 64) and bool(torch.isfinite(w).all()) and float(w.abs().max()) < 1.0


@pytest.mark.parametrize("argv", [["--rows", "5"], ["--hidden", "50"], ["--layers", "0"]])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        gguf_kernel.main(argv)
