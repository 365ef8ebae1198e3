"""`strand serve` / `strand demo` build the CPU kernels before any stage starts, where the user
sees it, and say nothing when the build is cached."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from strand.kernels import _cpu_build
from strand.services import cli


def test_a_cached_build_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    if _cpu_build.ensure_built() is not None:
        pytest.skip(f"CPU kernels unavailable here: {_cpu_build.ensure_built()}")
    cli._build_cpu_kernels("cpu")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_a_first_build_says_so_on_the_terminal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("STRAND_DISABLE_CPU_KERNELS", raising=False)
    monkeypatch.setattr(_cpu_build, "KERNELS", _cpu_build.CpuKernels())
    monkeypatch.setattr(_cpu_build, "build_dir", lambda: tmp_path)  # nothing cached there
    monkeypatch.setattr("torch.utils.cpp_extension.load",
                        lambda **kwargs: SimpleNamespace(name=kwargs["name"]))
    cli._build_cpu_kernels("auto")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("strand: building Strand's CPU kernels for ")
    assert out[-1].startswith("strand: built the CPU kernels in ")


def test_a_failed_build_is_one_line_on_stderr(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("STRAND_DISABLE_CPU_KERNELS", raising=False)
    monkeypatch.setattr(_cpu_build, "KERNELS", _cpu_build.CpuKernels())
    monkeypatch.setattr(_cpu_build, "build_dir", lambda: tmp_path)

    def no_compiler(**kwargs: object) -> None:
        raise RuntimeError("Error building extension: c++: not found")

    monkeypatch.setattr("torch.utils.cpp_extension.load", no_compiler)
    cli._build_cpu_kernels("cpu")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["strand: CPU kernels unavailable (RuntimeError: Error building extension: "
                   "c++: not found); the engine runs the slower pure-torch path"]


def test_cuda_stacks_build_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cpu_build, "ensure_built", lambda say=None: pytest.fail("built"))
    cli._build_cpu_kernels("cuda:0")
