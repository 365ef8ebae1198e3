"""The CPU ISA probe: levels from CPU flags, the STRAND_CPU_ISA cap, and what each level chooses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strand.platform import cpu_isa

AVX2_FLAGS = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
AVX512_FLAGS = AVX2_FLAGS | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    cpu_isa.probe.cache_clear()
    yield
    monkeypatch.undo()
    cpu_isa.probe.cache_clear()


def _on_cpu(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]) -> None:
    monkeypatch.setattr(cpu_isa, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(cpu_isa.platform, "machine", lambda: "x86_64")


@pytest.mark.parametrize(("flags", "level"), [(AVX512_FLAGS, "avx512"), (AVX2_FLAGS, "avx2"),
                                              (frozenset({"sse4_2", "avx"}), "generic")])
def test_the_level_is_the_widest_the_flags_allow(monkeypatch: pytest.MonkeyPatch,
                                                 fresh_probe: None, flags: frozenset[str],
                                                 level: str) -> None:
    monkeypatch.delenv(cpu_isa.ENV, raising=False)
    _on_cpu(monkeypatch, flags)
    isa = cpu_isa.probe()
    assert (isa.detected, isa.level, isa.overridden) == (level, level, False)


def test_strand_cpu_isa_avx2_makes_an_avx512_cpu_behave_as_avx2(
        monkeypatch: pytest.MonkeyPatch, fresh_probe: None) -> None:
    monkeypatch.setenv(cpu_isa.ENV, "avx2")
    _on_cpu(monkeypatch, AVX512_FLAGS | {"avx512_bf16"})
    isa = cpu_isa.probe()
    assert (isa.detected, isa.level, isa.overridden) == ("avx512", "avx2", True)
    assert not isa.onednn_bf16
    assert "-march=x86-64-v3" in isa.compile_flags()
    assert "capped by STRAND_CPU_ISA" in isa.describe()


def test_the_override_caps_onednn_mkl_and_aten_without_overriding_the_user(
        monkeypatch: pytest.MonkeyPatch, fresh_probe: None) -> None:
    monkeypatch.setenv(cpu_isa.ENV, "avx2")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # the user's own choice stays
    _on_cpu(monkeypatch, AVX512_FLAGS)
    cpu_isa.apply_override()
    import os

    assert os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert os.environ["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert os.environ["ATEN_CPU_CAPABILITY"] == "default"


def test_a_level_wider_than_the_cpu_is_refused(monkeypatch: pytest.MonkeyPatch,
                                               fresh_probe: None) -> None:
    monkeypatch.setenv(cpu_isa.ENV, "avx512")
    _on_cpu(monkeypatch, AVX2_FLAGS)
    with pytest.raises(ValueError, match="STRAND_CPU_ISA=avx512 is wider than this CPU"):
        cpu_isa.probe()


def test_an_unknown_level_names_the_variable_and_the_choices(monkeypatch: pytest.MonkeyPatch,
                                                            fresh_probe: None) -> None:
    monkeypatch.setenv(cpu_isa.ENV, "sse9")
    _on_cpu(monkeypatch, AVX2_FLAGS)
    with pytest.raises(ValueError, match="STRAND_CPU_ISA must be one of generic, avx2, avx512"):
        cpu_isa.probe()


@pytest.mark.parametrize(("flags", "want"), [(AVX512_FLAGS, True), (AVX2_FLAGS, False),
                                             (AVX2_FLAGS | {"avx_ne_convert"}, True)])
def test_onednn_bf16_needs_avx512_or_avx_ne_convert(monkeypatch: pytest.MonkeyPatch,
                                                    fresh_probe: None, flags: frozenset[str],
                                                    want: bool) -> None:
    monkeypatch.delenv(cpu_isa.ENV, raising=False)
    _on_cpu(monkeypatch, flags)
    assert cpu_isa.probe().onednn_bf16 is want


def test_the_build_flags_never_name_the_build_machine_beyond_tuning(
        monkeypatch: pytest.MonkeyPatch, fresh_probe: None) -> None:
    # -march=native would bake this CPU's widest instructions into a shared cache.
    monkeypatch.delenv(cpu_isa.ENV, raising=False)
    _on_cpu(monkeypatch, AVX512_FLAGS)
    flags = cpu_isa.probe().compile_flags()
    assert "-march=x86-64-v4" in flags and "-march=native" not in flags


def test_this_machine_probes_to_a_known_level() -> None:
    isa = cpu_isa.probe()
    assert isa.level in (*cpu_isa.LEVELS, "native")
    assert isa.level in isa.describe()


@pytest.mark.parametrize(("requested", "vnni"), [(None, True), ("avx2", False)])
def test_vnni_is_built_in_only_at_the_avx512_level_of_a_cpu_that_has_it(
        monkeypatch: pytest.MonkeyPatch, fresh_probe: None, requested: str | None,
        vnni: bool) -> None:
    if requested is None:
        monkeypatch.delenv(cpu_isa.ENV, raising=False)
    else:
        monkeypatch.setenv(cpu_isa.ENV, requested)
    _on_cpu(monkeypatch, AVX512_FLAGS | {"avx512_vnni"})
    isa = cpu_isa.probe()
    assert isa.vnni is vnni
    assert ("-mavx512vnni" in isa.compile_flags()) is vnni
    assert ("GGUF int8 dot products: AVX-512 VNNI" in isa.describe()) is vnni


def test_an_avx512_cpu_without_vnni_takes_the_maddubs_dot_products(
        monkeypatch: pytest.MonkeyPatch, fresh_probe: None) -> None:
    monkeypatch.delenv(cpu_isa.ENV, raising=False)
    _on_cpu(monkeypatch, AVX512_FLAGS)
    isa = cpu_isa.probe()
    assert not isa.vnni and "-mavx512vnni" not in isa.compile_flags()
    assert "GGUF int8 dot products: AVX-512 (no VNNI)" in isa.describe()


def test_vnni_can_be_left_out_to_build_what_a_cpu_without_it_runs(
        monkeypatch: pytest.MonkeyPatch, fresh_probe: None) -> None:
    # CI's pass as on Skylake-SP: this CPU's avx512 level, without vpdpbusd.
    monkeypatch.delenv(cpu_isa.ENV, raising=False)
    monkeypatch.setenv("STRAND_DISABLE_VNNI", "1")
    _on_cpu(monkeypatch, AVX512_FLAGS | {"avx512_vnni"})
    isa = cpu_isa.probe()
    assert isa.level == "avx512" and not isa.vnni
    assert "-mavx512vnni" not in isa.compile_flags()


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_the_vendor_is_read_from_cpuinfo(monkeypatch: pytest.MonkeyPatch, fresh_probe: None,
                                         vendor: str) -> None:
    cpuinfo = f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu avx avx2\n"
    monkeypatch.setattr(cpu_isa.Path, "read_text", lambda self, **kw: cpuinfo)
    assert cpu_isa._cpu_vendor() == vendor
    assert cpu_isa._cpu_flags() == frozenset({"fpu", "avx", "avx2"})
