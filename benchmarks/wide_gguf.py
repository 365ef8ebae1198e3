"""A wider model for benchmarks/quantized.py than SmolLM2, made by llama.cpp's own tools: a
random-weight Llama (12 layers, hidden 2048, GQA 32/4 heads, MLP 5632, SmolLM2's 49152-token
vocabulary, tied embeddings: ~0.63B parameters) written as an HF directory, converted to an F32
GGUF by llama.cpp's convert_hf_to_gguf.py and quantized by its llama-quantize (default Q4_K_M).

    python -m benchmarks.wide_gguf [--dir ~/.cache/strand/bench] [--types Q4_K_M ...]

SmolLM2's rows are 576 weights, which no K-quant super-block (256) divides, so llama.cpp writes
most of its "Q4_K_M" in Q5_0; rows of 2048 and 5632 weights take the K-quants as a 7B model's
do (Q4_K, with Q6_K for attn_v and ffn_down in some layers and for the output). Needs what
`python -m benchmarks.cpu_peers_setup` makes first (llama.cpp's build and SmolLM2's tokenizer);
each step is skipped when its output is there. Prints the benchmark's command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import log
from benchmarks.cpu_peers_setup import ensure_converter_deps

SHAPE: dict[str, Any] = {"num_layers": 12, "hidden_size": 2048, "num_heads": 32, "num_kv_heads": 4,
         "vocab_size": 49152, "intermediate_size": 5632}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def make_hf_dir(root: Path) -> Path:
    from strand.testing.tiny_model import make_tiny_model

    out = root / "wide-0.6b-hf"
    if (out / "model.safetensors").is_file():
        return out
    tokenizer_dir = root / "smollm2-135m-f32-hf"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise SystemExit(f"{tokenizer_dir} is missing: run python -m benchmarks.cpu_peers_setup")
    log(f"writing a random {SHAPE} Llama into {out}")
    make_tiny_model(out, "llama", tie_word_embeddings=True, with_tokenizer=False, seed=0,
                    **SHAPE)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


def convert_f32(hf_dir: Path, src_root: Path, root: Path) -> Path:
    out = root / "wide-0.6b-f32.gguf"
    if not out.is_file():
        ensure_converter_deps()
        env = {**os.environ, "PYTHONPATH": str(src_root / "gguf-py")}
        log(f"converting {hf_dir.name} to {out.name} (llama.cpp's convert_hf_to_gguf.py)")
        subprocess.run([sys.executable, str(src_root / "convert_hf_to_gguf.py"), str(hf_dir),
                        "--outtype", "f32", "--outfile", str(out)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
    return out


def quantize(f32: Path, bin_dir: Path, kind: str) -> Path:
    out = f32.with_name(f"wide-0.6b-{kind}.gguf")
    if not out.is_file():
        log(f"llama-quantize {f32.name} -> {out.name}")
        done = subprocess.run([str(bin_dir / "llama-quantize"), str(f32), str(out), kind],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:  # e.g. a --types name llama-quantize does not know: its words
            tail = done.stderr.strip().splitlines()[-3:]
            raise SystemExit(f"llama-quantize {kind} failed: " + " | ".join(tail))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wide_gguf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    default = Path(os.environ.get("STRAND_CACHE_DIR", Path.home() / ".cache" / "strand")) / "bench"
    parser.add_argument("--dir", type=Path, default=default, help="cpu_peers_setup's directory")
    parser.add_argument("--types", nargs="+", default=["Q4_K_M"],
                        help="llama-quantize types to make (Q4_K_M, Q5_K_M, Q6_K, ...)")
    args = parser.parse_args(argv)
    root = args.dir.expanduser()
    src_root, bin_dir = root / "llama-cpp-src", root / "llama-cpp-src" / "build" / "bin"
    if not (bin_dir / "llama-quantize").is_file():
        parser.error(f"{bin_dir / 'llama-quantize'} is missing: run "
                     "python -m benchmarks.cpu_peers_setup")
    f32 = convert_f32(make_hf_dir(root), src_root, root)
    for kind in args.types:
        path = quantize(f32, bin_dir, kind)
        print(f"python -m benchmarks.quantized --model {path} --no-q8 --threads 1 2 "
              f"--llama-cpp {bin_dir}")


if __name__ == "__main__":
    main()
