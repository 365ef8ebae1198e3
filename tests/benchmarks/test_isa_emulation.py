"""The AVX2 emulation of benchmarks/cpu_peers.py: the caps it sets, that each library honours them,
the llama.cpp build it asks for, and the objdump check that refuses a wider llama.cpp."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import cpu_peers, cpu_peers_setup, isa_emulation
from strand.platform import cpu_isa

AVX2_ENV = {"STRAND_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2",
            "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def test_avx2_caps_strand_aten_onednn_and_mkl() -> None:
    assert isa_emulation.isa_env("avx2") == AVX2_ENV
    assert isa_emulation.isa_env("native") == {}
    with pytest.raises(ValueError, match="isa must be one of native, avx2, got 'avx512f'"):
        isa_emulation.isa_env("avx512f")


def test_a_worker_gets_the_caps_under_its_backends_own_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")  # the caller's own: --isa wins over it
    args = argparse.Namespace(isa="avx2")
    env = cpu_peers.worker_env(args, {"STRAND_DISABLE_CPU_KERNELS": "1"})
    assert {k: env[k] for k in AVX2_ENV} == AVX2_ENV
    assert env["STRAND_DISABLE_CPU_KERNELS"] == "1"
    native = cpu_peers.worker_env(argparse.Namespace(isa="native"), {})
    assert native["ATEN_CPU_CAPABILITY"] == "avx512"


def test_the_avx2_llama_cpp_build_turns_every_wider_option_off() -> None:
    cmd = cpu_peers_setup.cmake_configure_cmd(Path("/src"), "avx2")
    assert cmd[cmd.index("-B") + 1] == "/src/build-avx2"
    flags = {arg[2:].split("=")[0]: arg.split("=")[1] for arg in cmd if arg.startswith("-DGGML_")}
    assert flags["GGML_NATIVE"] == "OFF"
    for on in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C"):
        assert flags[on] == "ON"
    wider = ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
             "GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
    assert all(flags[off] == "OFF" for off in wider)
    native = cpu_peers_setup.cmake_configure_cmd(Path("/src"), "native")
    assert "-DGGML_NATIVE=ON" in native and native[native.index("-B") + 1] == "/src/build"
    with pytest.raises(ValueError, match="isa must be one of native, avx2"):
        cpu_peers_setup.cmake_configure_cmd(Path("/src"), "sse2")


@pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("objdump")),
                    reason="needs gcc and objdump")
def test_objdump_finds_zmm_code_and_refuses_that_build_for_avx2(tmp_path: Path) -> None:
    source = tmp_path / "add.c"
    # Vectorised at -O3: 16-wide (zmm) with AVX-512 and a 512-bit preference, 8-wide without.
    source.write_text("void add(float *restrict a, const float *restrict b, int n) {\n"
                      "  for (int i = 0; i < n; i++) a[i] += b[i];\n}\n")
    narrow, wide = tmp_path / "narrow", tmp_path / "wide"
    for out, flags in ((narrow, ["-march=x86-64-v3"]),
                       (wide, ["-march=x86-64-v4", "-mprefer-vector-width=512"])):
        out.mkdir()
        subprocess.run(["gcc", "-O3", "-shared", "-fPIC", *flags, str(source), "-o",
                        str(out / "libadd.so")], check=True)
    (narrow / "notes.txt").write_text("%zmm0 in a text file is not code\n")
    assert isa_emulation.zmm_users(narrow) == {}
    assert isa_emulation.zmm_users(wide)["libadd.so"] > 0
    isa_emulation.check_llama_cpp(narrow, "avx2")
    isa_emulation.check_llama_cpp(wide, "native")  # native: any build is this CPU's own
    with pytest.raises(ValueError, match="holds AVX-512 \\(zmm\\) instructions"):
        isa_emulation.check_llama_cpp(wide, "avx2")


@pytest.mark.skipif(cpu_isa.probe().detected not in ("avx2", "avx512"),
                    reason="needs an x86 CPU with AVX2")
def test_a_process_started_under_the_caps_runs_at_avx2() -> None:
    """The libraries read the caps at their first use: a fresh process shows them honoured."""
    probe = ("import json, torch; from benchmarks import isa_emulation; "
             "from strand.kernels import cpu_linear; a, b = torch.ones(64, 256), torch.ones(256, 256); "
             "torch.matmul(a, b); cpu_linear.unavailable_reason() or cpu_linear.linear(a, b, None); "
             "print(json.dumps(isa_emulation.observed()))")
    env = {**os.environ, **isa_emulation.isa_env("avx2"), "MKL_VERBOSE": "1",
           "ONEDNN_VERBOSE": "1"}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, check=True, timeout=120)
    ran = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ran["aten"] == "AVX2" and ran["strand"] == "avx2"
    assert ran["env"] == AVX2_ENV
    mkl_banner = [line for line in proc.stdout.splitlines() if "oneMKL" in line]
    if mkl_banner:  # torch built with MKL: on Intel CPUs its banner names the code path it took;
        # on AMD ones it names none ("Intel(R) Architecture processors"), and must not say AVX-512
        assert "AVX-512" not in mkl_banner[0]
        if "AVX" in mkl_banner[0]:
            assert "AVX2" in mkl_banner[0]
    onednn = [line for line in proc.stdout.splitlines() if line.startswith("onednn_verbose")]
    if onednn:  # oneDNN ran (the engine's linear layers): its CPU ISA and every kernel it ran
        assert any("isa:Intel AVX2" in line for line in onednn)
        assert not any(",exec," in line and "avx512" in line for line in onednn)
