"""benchmarks/decode_attention.py: one tiny pass over paged caches, and its argument checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import decode_attention
from strand.kernels._cpu_build import KERNELS

TINY = ["--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--repeats", "1",
        "--copy-mib", "1", "--threads", "1"]


@pytest.mark.skipif(KERNELS.module() is None, reason="CPU kernels unavailable")
@pytest.mark.parametrize("requests", ["1", "3"])
def test_one_tiny_pass_reports_its_rate(requests: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    decode_attention.main(TINY + ["--context", "5", "40", "--requests", requests,
                                  "--out", str(out)])
    table = capsys.readouterr().out
    assert "of the copy rate" in table
    report = json.loads(out.read_text())
    assert [r["context"] for r in report["results"]] == [5, 40]
    assert all(r["us_per_layer"] > 0 and r["kv_bytes_per_s"] > 0 for r in report["results"])


def test_caches_scatter_each_requests_blocks_over_the_pool() -> None:
    caches, table = decode_attention.layer_caches(40, 2, 3, 2, 8, torch.bfloat16)
    assert len(caches) == 3 and caches[0].shape == (2, 12, 16, 2, 8)
    assert caches[0].dtype == torch.bfloat16
    assert table.tolist() == [[0, 2, 4], [6, 8, 10]]


@pytest.mark.parametrize("argv", [["--heads", "6", "--kv-heads", "4"], ["--context", "0"],
                                  ["--layers", "0"], ["--copy-mib", "0"]])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        decode_attention.main(argv)
