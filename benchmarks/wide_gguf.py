"""Random-weight GGUF models of the shapes people run, made by llama.cpp's own tools, for
benchmarks/quantized.py and the llama.cpp comparisons:

    python -m benchmarks.wide_gguf [--dir ~/.cache/strand/bench] [--shape wide-0.6b]
        [--types Q4_K_M ...] [--keep-hf]

Shapes (--shape; the real models' dimensions, random weights):
  wide-0.6b     Llama, 12 layers, hidden 2048, GQA 32/4 heads, MLP 5632, SmolLM2's 49152-token
                vocabulary, tied embeddings: ~0.63B parameters (default types: Q4_K_M)
  llama-3.2-1b  Llama, 16 layers, hidden 2048, 32/8 heads, MLP 8192, vocabulary 128256, tied,
                rope_theta 500000, llama3 rope scaling: 1.24B (F32 BF16 Q8_0 Q4_K_M)
  qwen2.5-3b    Qwen2 (q/k/v biases), 36 layers, hidden 2048, 16/2 heads, MLP 11008, vocabulary
                151936, tied, rope_theta 1e6: 3.09B (BF16 Q8_0 Q4_K_M)
  llama-3.1-8b  Llama, 32 layers, hidden 4096, 32/8 heads, MLP 14336, vocabulary 128256, untied,
                rope_theta 500000, llama3 rope scaling: 8.03B (Q4_K_M Q8_0)

Each is written as an HF directory (<shape>-hf/), converted by llama.cpp's convert_hf_to_gguf.py
(F32 and BF16: <shape>-f32.gguf, <shape>-bf16.gguf) and quantized by its llama-quantize
(<shape>-Q4_K_M.gguf, ...; from the F32 file where one is made, else from the BF16 one).
wide-0.6b is written whole in float32 by strand.testing.tiny_model (linears ~ N(0, 1/fan_in)),
as it always was; the others shard by shard in bfloat16 (model-0000k-of-0000n.safetensors and
model.safetensors.index.json; linears, biases and the embedding ~ N(0, 0.02^2), norms 1),
so that no shape is ever whole in memory (8B in float32 would be 32 GB).
All use SmolLM2's tokenizer (from `python -m benchmarks.cpu_peers_setup`, which must run first:
it also builds llama.cpp); a config vocabulary larger than its 49152 tokens is padded by the
converter with [PAD<id>] tokens, so the embedding and output tables keep the real shapes.
SmolLM2's own rows are 576 weights, which no K-quant super-block (256) divides, so llama.cpp writes
most of its "Q4_K_M" in Q5_0; rows of 2048 and more take the K-quants as a 7B model's do (Q4_K,
with Q6_K for attn_v and ffn_down in some layers and for the output).
Files that were not asked for are deleted once the asked ones exist (disk: the 8B HF directory and
BF16 file are 16 GB each): the HF directory (kept for wide-0.6b and llama-3.2-1b, or with
--keep-hf) and an F32/BF16 file made only to quantize from (wide-0.6b keeps its F32 file). Each
step is skipped when its output is there. Prints the benchmark's command for each file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import log
from benchmarks.cpu_peers_setup import ensure_converter_deps

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
FLOAT_TYPES = ("F32", "BF16")  # convert_hf_to_gguf.py's --outtype; the rest are llama-quantize's
SHARD_BYTES = 2 << 30  # bfloat16 safetensors shards of about 2 GiB
INIT_STD = 0.02  # the HF initializer_range of these models


@dataclass(frozen=True)
class Shape:
    arch: str  # make_tiny_model's: "llama" or "qwen2"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    types: tuple[str, ...]  # the default --types
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    keep: frozenset[str] = field(default_factory=frozenset)  # "hf", "F32", "BF16": never deleted
    legacy: bool = False  # written whole in float32 by make_tiny_model, as wide-0.6b always was


def _llama3_rope(factor: float) -> dict[str, Any]:
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


SHAPES: dict[str, Shape] = {
    "wide-0.6b": Shape("llama", 12, 2048, 32, 4, 5632, 49152, True, ("Q4_K_M",),
                       keep=frozenset({"hf", "F32"}), legacy=True),
    "llama-3.2-1b": Shape("llama", 16, 2048, 32, 8, 8192, 128256, True,
                          ("F32", "BF16", "Q8_0", "Q4_K_M"), rope_theta=500000.0,
                          rope_scaling=_llama3_rope(32.0), max_position_embeddings=131072,
                          rms_norm_eps=1e-5, keep=frozenset({"hf"})),
    "qwen2.5-3b": Shape("qwen2", 36, 2048, 16, 2, 11008, 151936, True, ("BF16", "Q8_0", "Q4_K_M"),
                        rope_theta=1000000.0, max_position_embeddings=32768),
    "llama-3.1-8b": Shape("llama", 32, 4096, 32, 8, 14336, 128256, False, ("Q4_K_M", "Q8_0"),
                          rope_theta=500000.0, rope_scaling=_llama3_rope(8.0),
                          max_position_embeddings=131072, rms_norm_eps=1e-5),
}


def gguf_path(root: Path, name: str, kind: str) -> Path:
    """<shape>-f32.gguf / -bf16.gguf (the converter's outtype), <shape>-Q4_K_M.gguf (llama-quantize's
    type): the names wide-0.6b's files always had."""
    return root / f"{name}-{kind.lower() if kind in FLOAT_TYPES else kind}.gguf"


def _hf_done(out: Path) -> bool:
    return (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file()


def make_hf_dir(root: Path, name: str) -> Path:
    shape = SHAPES[name]
    out = root / f"{name}-hf"
    if _hf_done(out):
        return out
    tokenizer_dir = root / "smollm2-135m-f32-hf"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise SystemExit(f"{tokenizer_dir} is missing: run python -m benchmarks.cpu_peers_setup")
    if shape.legacy:
        from strand.testing.tiny_model import make_tiny_model

        log(f"writing a random {name} {shape.arch} into {out}")
        make_tiny_model(out, shape.arch, num_layers=shape.num_layers,
                        hidden_size=shape.hidden_size, num_heads=shape.num_heads,
                        num_kv_heads=shape.num_kv_heads, vocab_size=shape.vocab_size,
                        intermediate_size=shape.intermediate_size,
                        tie_word_embeddings=shape.tie_word_embeddings, with_tokenizer=False,
                        seed=0)
    else:
        write_sharded_bf16(out, shape, name)
    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).is_file():
            shutil.copy(tokenizer_dir / file, out / file)
    return out


def hf_config(shape: Shape) -> dict[str, Any]:
    """config.json: make_tiny_model's for the family, with the real model's positions and eps."""
    from strand.testing.tiny_model import _config

    config = _config(shape.arch, shape.num_layers, shape.hidden_size, shape.num_heads,
                     shape.num_kv_heads, shape.vocab_size, shape.intermediate_size,
                     shape.max_position_embeddings, shape.tie_word_embeddings, shape.rope_scaling,
                     shape.rope_theta, "bfloat16", None)
    config.update(rms_norm_eps=shape.rms_norm_eps, initializer_range=INIT_STD)
    return config


def tensor_shapes(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every tensor, in checkpoint order."""
    hidden, inter, vocab = (config["hidden_size"], config["intermediate_size"],
                            config["vocab_size"])
    q_size = config["num_attention_heads"] * config["head_dim"]
    kv_size = config["num_key_value_heads"] * config["head_dim"]
    bias = config["model_type"] == "qwen2"
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (hidden,)))
        for proj, size in (("q", q_size), ("k", kv_size), ("v", kv_size)):
            out.append((f"{p}self_attn.{proj}_proj.weight", (size, hidden)))
            if bias:
                out.append((f"{p}self_attn.{proj}_proj.bias", (size,)))
        out += [(p + "self_attn.o_proj.weight", (hidden, q_size)),
                (p + "post_attention_layernorm.weight", (hidden,)),
                (p + "mlp.gate_proj.weight", (inter, hidden)),
                (p + "mlp.up_proj.weight", (inter, hidden)),
                (p + "mlp.down_proj.weight", (hidden, inter))]
    out.append(("model.norm.weight", (hidden,)))
    if not config["tie_word_embeddings"]:
        out.append(("lm_head.weight", (vocab, hidden)))
    return out


def write_sharded_bf16(out: Path, shape: Shape, name: str, seed: int = 0) -> None:
    """Random bfloat16 weights, one shard in memory at a time; the index is written last, so a
    directory without it is an interrupted one and is written again."""
    import torch
    from safetensors.torch import save_file

    config = hf_config(shape)
    specs = tensor_shapes(config)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for spec in specs:
        nbytes = 2 * math.prod(spec[1])
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    total = sum(2 * math.prod(s) for _, s in specs)
    log(f"writing a random {name} {shape.arch} ({sum(math.prod(s) for _, s in specs) / 1e9:.2f}B "
        f"parameters, {total / 2**30:.1f} GiB bfloat16, {len(shards)} shards) into {out}")
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
                  "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    gen = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    for k, shard in enumerate(shards):
        started = time.perf_counter()
        tensors: dict[str, torch.Tensor] = {}
        for tensor_name, dims in shard:
            if tensor_name.endswith("norm.weight"):
                tensors[tensor_name] = torch.ones(dims, dtype=torch.bfloat16)
            else:  # linears, the embedding and Qwen2's q/k/v biases
                t = torch.empty(dims, dtype=torch.float32).normal_(0.0, INIT_STD, generator=gen)
                tensors[tensor_name] = t.to(torch.bfloat16)
                del t
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
        log(f"  {fname}: {len(tensors)} tensors, "
            f"{sum(t.numel() for t in tensors.values()) * 2 / 2**30:.2f} GiB "
            f"({time.perf_counter() - started:.0f} s)")
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")


# transformers 5 loads the tokenizer of every model_type "qwen2" directory as Qwen2Tokenizer,
# whatever tokenizer_config.json names, and that puts Qwen's pre-tokenizer before SmolLM2's
# vocabulary: the converter then knows no hash of it ("BPE pre-tokenizer was not recognized").
# The converter is run with AutoTokenizer reading tokenizer.json as it is (SmolLM2's "smollm").
_AS_IS_TOKENIZER = """import runpy, sys, transformers
from transformers import PreTrainedTokenizerFast
transformers.AutoTokenizer.from_pretrained = staticmethod(PreTrainedTokenizerFast.from_pretrained)
sys.argv = sys.argv[1:]
sys.path.insert(0, sys.argv[0].rpartition("/")[0])
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(hf_dir: Path, src_root: Path, out: Path, kind: str, as_is_tokenizer: bool) -> Path:
    if not out.is_file():
        ensure_converter_deps()
        env = {**os.environ, "PYTHONPATH": str(src_root / "gguf-py")}
        log(f"converting {hf_dir.name} to {out.name} (llama.cpp's convert_hf_to_gguf.py)")
        started = time.perf_counter()
        partial = out.with_name(out.name + ".part")
        shim = ["-c", _AS_IS_TOKENIZER] if as_is_tokenizer else []
        subprocess.run([sys.executable, *shim, str(src_root / "convert_hf_to_gguf.py"),
                        str(hf_dir), "--outtype", kind.lower(), "--outfile", str(partial)],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        partial.rename(out)
        log(f"  {out.name}: {out.stat().st_size / 2**30:.2f} GiB "
            f"({time.perf_counter() - started:.0f} s)")
    return out


def quantize(source: Path, out: Path, bin_dir: Path, kind: str) -> Path:
    if not out.is_file():
        log(f"llama-quantize {source.name} -> {out.name}")
        started = time.perf_counter()
        partial = out.with_name(out.name + ".part")
        done = subprocess.run([str(bin_dir / "llama-quantize"), str(source), str(partial), kind],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:  # e.g. a --types name llama-quantize does not know: its words
            partial.unlink(missing_ok=True)
            tail = done.stderr.strip().splitlines()[-3:]
            raise SystemExit(f"llama-quantize {kind} failed: " + " | ".join(tail))
        partial.rename(out)
        log(f"  {out.name}: {out.stat().st_size / 2**30:.2f} GiB "
            f"({time.perf_counter() - started:.0f} s)")
    return out


def make(root: Path, name: str, types: list[str], src_root: Path, bin_dir: Path,
         keep_hf: bool = False) -> dict[str, Path]:
    """The asked GGUF files of a shape, by type; then what was not asked for is deleted."""
    shape = SHAPES[name]
    wanted = {kind: gguf_path(root, name, kind) for kind in types}
    base_kind = "F32" if "F32" in types or "F32" in shape.keep else "BF16"
    base = gguf_path(root, name, base_kind)
    if not all(path.is_file() for path in wanted.values()):
        # Converting goes from the HF directory, quantizing from the base file.
        needs_base = any(not path.is_file() for kind, path in wanted.items()
                         if kind not in FLOAT_TYPES) and not base.is_file()
        floats = [kind for kind in FLOAT_TYPES
                  if (kind in wanted and not wanted[kind].is_file())
                  or (kind == base_kind and needs_base)]
        if floats:
            hf_dir = make_hf_dir(root, name)
            for kind in floats:
                convert(hf_dir, src_root, gguf_path(root, name, kind), kind,
                        as_is_tokenizer=shape.arch == "qwen2")
        if not (keep_hf or "hf" in shape.keep):
            _remove(root / f"{name}-hf")
        for kind, path in wanted.items():
            if kind not in FLOAT_TYPES:
                quantize(base, path, bin_dir, kind)
    if base_kind not in types and base_kind not in shape.keep:
        _remove(base)
    return wanted


def _remove(path: Path) -> None:
    if path.is_dir():
        log(f"deleting {path}")
        shutil.rmtree(path)
    elif path.is_file():
        log(f"deleting {path}")
        path.unlink()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wide_gguf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    default = Path(os.environ.get("STRAND_CACHE_DIR", Path.home() / ".cache" / "strand")) / "bench"
    parser.add_argument("--dir", type=Path, default=default, help="cpu_peers_setup's directory")
    parser.add_argument("--shape", default="wide-0.6b", choices=list(SHAPES))
    parser.add_argument("--types", nargs="+", default=None,
                        help="F32 and BF16 (the converter's) and llama-quantize types (Q4_K_M, "
                             "Q8_0, Q6_K, ...); default: the shape's (see above)")
    parser.add_argument("--keep-hf", action="store_true",
                        help="keep the HF directory of a shape that would delete it")
    args = parser.parse_args(argv)
    root = args.dir.expanduser()
    src_root, bin_dir = root / "llama-cpp-src", root / "llama-cpp-src" / "build" / "bin"
    if not (bin_dir / "llama-quantize").is_file():
        parser.error(f"{bin_dir / 'llama-quantize'} is missing: run "
                     "python -m benchmarks.cpu_peers_setup")
    types = [t.upper() if t.upper() in FLOAT_TYPES else t
             for t in (args.types or SHAPES[args.shape].types)]
    files = make(root, args.shape, types, src_root, bin_dir, args.keep_hf)
    for kind, path in files.items():
        log(f"{path}: {path.stat().st_size / 2**30:.2f} GiB")
        if kind not in FLOAT_TYPES:
            print(f"python -m benchmarks.quantized --model {path} --no-q8 --threads 1 2 "
                  f"--llama-cpp {bin_dir}")


if __name__ == "__main__":
    main()
