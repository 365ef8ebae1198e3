"""The CPU kernels build once, as one extension named by ISA level and sources, and say nothing
when the build is already there."""

from __future__ import annotations

from pathlib import Path

import pytest

from strand.kernels import _cpu_build
from strand.platform.cpu_isa import probe


def test_the_extension_is_named_by_level_and_a_hash_of_what_it_is_built_from() -> None:
    name = _cpu_build.extension_name()
    assert name.startswith(f"strand_cpu_kernels_{probe().level}_")
    assert name == _cpu_build.extension_name()  # stable across calls


def test_a_changed_source_gets_a_new_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for src in _cpu_build.CSRC.iterdir():
        (tmp_path / src.name).write_bytes(src.read_bytes())
    monkeypatch.setattr(_cpu_build, "CSRC", tmp_path)
    before = _cpu_build.extension_name()
    (tmp_path / "elementwise.cpp").write_text("// changed\n", encoding="utf-8")
    assert _cpu_build.extension_name() != before


def test_every_kernel_source_is_in_the_one_extension() -> None:
    names = {p.name for p in _cpu_build._sources()}
    assert {"bindings.cpp", "decode_attention.cpp", "prefill_attention.cpp",
            "elementwise.cpp"} <= names


def test_a_cached_build_loads_without_a_word(monkeypatch: pytest.MonkeyPatch) -> None:
    if _cpu_build.ensure_built() is not None:
        pytest.skip(f"CPU kernels unavailable here: {_cpu_build.ensure_built()}")
    assert _cpu_build.is_cached()
    said: list[str] = []
    fresh = _cpu_build.CpuKernels()
    module = fresh.module(said.append)
    assert module is not None and hasattr(module, "decode_attention")
    assert said == []


def test_disabled_kernels_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAND_DISABLE_CPU_KERNELS", "1")
    fresh = _cpu_build.CpuKernels()
    assert fresh.module() is None
    assert fresh.unavailable_reason() == "disabled by STRAND_DISABLE_CPU_KERNELS"
    # A caller without a torch fallback gets the reason in its error.
    with pytest.raises(RuntimeError, match="CPU kernels unavailable: disabled by STRAND_DISABLE"):
        fresh.require()


def test_a_failed_build_falls_back_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.delenv("STRAND_DISABLE_CPU_KERNELS", raising=False)
    monkeypatch.setattr(_cpu_build, "build_dir", lambda: tmp_path)  # nothing cached there

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error building extension: c++: not found")

    monkeypatch.setattr("torch.utils.cpp_extension.load", no_compiler)
    said: list[str] = []
    fresh = _cpu_build.CpuKernels()
    assert fresh.module(said.append) is None
    assert "c++: not found" in (fresh.unavailable_reason() or "")
    assert said and said[0].startswith("building Strand's CPU kernels")
