"""bs=1 decode of a GGUF model with its weights kept packed (EngineArgs quantization="gguf")
against the same file dequantized to float32 at load, and the weight bytes each reads per token.

    python -m benchmarks.quantized [--model smollm2|FILE.gguf] [--threads N [N ...]]
        [--repeats 3] [--prompt 32] [--tokens 64] [--no-q8] [--no-float32] [--llama-cpp DIR]
        [--kv-cache-dtype auto|bfloat16] [--isa native|avx2]
        [--out results.json]

Rows: the file dequantized (float32), the file packed (SmolLM2's: Q4_1 layers, a Q8_0 embedding
that the tied lm_head reads; a Q4_K_M file's Q4_K, Q5_0 and Q6_K layers: benchmarks/wide_gguf.py
and cpu_peers_setup.py make such files with llama.cpp's own tools), and, unless --no-q8, a Q8_0
copy of the same file packed (every
Q4_0/Q4_1 tensor re-quantized to Q8_0 by gguf's quantizer: the same model up to Q8_0's
rounding). Each row: one request, --prompt random tokens then --tokens greedy decode steps;
decode tok/s = (tokens - 1) / (time after the first token), median of --repeats after a warm-up;
CPU ms/token the process's CPU time (all threads) over the same tokens, which waiting for a core
on a shared machine does not inflate.
bytes/token is what a decode step reads of the weights: every linear layer (packed or float),
the norms, and one embedding row; beside it, the KV cache a step reads at the decode's mean
context (--prompt + half of --tokens: < 1% of the weights' bytes at the default lengths, more
past a few hundred tokens).
The bandwidth bound is the machine's copy rate (same thread count) over those bytes. With
--llama-cpp, llama.cpp's llama-bench (-p 0 -n TOKENS -d PROMPT -r 1, same threads: its decode
starts at the same depth of context) runs on the same packed file after each of Strand's timed
requests: the two take turns, --repeats times, and "turn by turn" is the median (and range) of
Strand's rate over llama.cpp's in each turn. Where the memory speed moves from one minute to
the next (a shared VM's can), one engine's rows all taken before the other's would compare the
two minutes, not the engines. llama.cpp keeps its KV cache in float16, Strand in float32 unless --kv-cache-dtype
bfloat16 (16 bits a value, as llama.cpp's); past a few hundred tokens of context the cache's
bytes join the weights' in what a step reads. --isa avx2 measures an AVX2-only CPU on a wider one
(benchmarks/isa_emulation.py: Strand's kernels, torch, oneDNN and MKL capped; --llama-cpp must
then be a build without AVX-512, e.g. llama-cpp-src/build-avx2/bin).
"""

from __future__ import annotations

import argparse
import functools
import gc
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import isa_emulation
from benchmarks.common import format_table, log, write_json
from benchmarks.cpu_peers import parse_llama_bench
from strand.engine_core.outputs import RequestOutput


def weight_bytes_per_token(model: Any) -> int:
    """Bytes of weights one decode token reads: linear layers whole (their packed copy where it
    is their only one), the embedding one row (in its blocks' type where it keeps them)."""
    import torch

    from strand.engine_core.model_executor.layers.embedding import PanelEmbedding
    from strand.engine_core.model_executor.layers.gguf_embedding import GGUFEmbedding
    from strand.engine_core.model_executor.layers.gguf_linear import GGUFLinear
    from strand.engine_core.model_executor.layers.linear import Linear
    from strand.engine_core.model_executor.layers.rms_norm import RMSNorm

    def blocks(layer: GGUFLinear) -> int:
        return sum(b.nbytes for b, _ in layer.parts())

    # An untied GGUF embedding's own table is read a row a token, not whole as a layer is.
    tables = {id(m.table) for m in model.modules()
              if isinstance(m, GGUFEmbedding) and m.table is not model.lm_head}
    total = 0
    for module in model.modules():
        if isinstance(module, GGUFEmbedding):
            total += blocks(module.table) // module.num_embeddings
        elif isinstance(module, GGUFLinear) and id(module) not in tables:
            total += blocks(module) + (0 if module.bias is None else module.bias.nbytes)
        elif isinstance(module, Linear):
            total += sum(p.nbytes for p in module.parameters(recurse=False))
            if module.panels_only and module.packed is not None:
                total += module.packed.nbytes
        elif isinstance(module, RMSNorm):
            total += module.weight.nbytes
        elif isinstance(module, torch.nn.Embedding):
            total += module.weight[0].nbytes
        elif isinstance(module, PanelEmbedding):
            total += module.embedding_dim * module.panels.element_size()
    return total


def gguf_copy_writer(reader: Any, dst: Path, skip: tuple[str, ...] = ()) -> Any:
    """A GGUFWriter to dst holding reader's metadata (all but the header's counts and the keys
    in `skip`), for a copy of the file whose tensors the caller adds."""
    import gguf

    writer = gguf.GGUFWriter(str(dst), str(reader.fields["general.architecture"].contents()))
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in skip:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), vtype, sub_type=sub)
    return writer


def requantize(src: Path, dst: Path, kind: str = "Q8_0") -> Path:
    """A copy of src with every Q4_0/Q4_1 tensor re-quantized to `kind` (metadata kept)."""
    import gguf
    import numpy as np

    if dst.is_file():
        return dst
    reader = gguf.GGUFReader(str(src))
    writer = gguf_copy_writer(reader, Path(str(dst) + ".part"), ("general.file_type",))
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    # What llama.cpp's tools label the file with ("Q8_0"), no longer the source's type.
    writer.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{kind}"))
    low = (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1)
    for t in reader.tensors:
        if t.tensor_type in low:
            dense = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            writer.add_tensor(t.name, gguf.quants.quantize(dense, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    Path(str(dst) + ".part").rename(dst)
    return dst


def kv_bytes_per_token(engine: Any, context: float) -> int:
    """Bytes of K and V one decode token reads at `context` tokens: every layer's, in the
    cache's dtype."""
    from strand.engine_core.model_executor.kv_cache_sizing import bytes_per_block

    return round(bytes_per_block(engine.engine_core.runner.kv_config, 1) * context)


def measure(model: str, quantization: str | None, threads: int | None,
            args: argparse.Namespace,
            between: Callable[[], None] | None = None) -> dict[str, Any]:
    """Strand's rows: a warm-up request, then --repeats timed ones, `between` called after each
    timed one (the peer's turn)."""
    from strand.engine_core import EngineArgs, LLMEngine, SamplingParams

    engine = LLMEngine.from_engine_args(EngineArgs(
        model=model, dtype="float32", quantization=quantization, cpu_threads=threads,
        max_model_len=max(1024, args.prompt + args.tokens), enable_prefix_caching=False,
        max_num_seqs=1, kv_cache_dtype=args.kv_cache_dtype))
    vocab = engine.engine_core.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    rates: list[float] = []
    cpu_ms: list[float] = []  # CPU time (all threads) per decoded token: no waiting for a core
    for rep in range(args.repeats + 1):  # the first is the warm-up
        rng = random.Random(rep)
        engine.add_request(f"r{rep}", {"prompt_token_ids": [rng.randrange(100, vocab - 1)
                                                            for _ in range(args.prompt)]},
                           params)
        marks: list[tuple[float, float, int]] = []  # after each step: wall, CPU, tokens out
        tokens = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                assert isinstance(out, RequestOutput)  # a generating engine's
                tokens = len(out.outputs[0].token_ids)
            marks.append((time.perf_counter(), time.process_time(), tokens))
        if rep:
            rate, ms = decode_rate(marks)
            rates.append(rate)
            cpu_ms.append(ms)
            if between is not None:
                between()
    result = {"decode_tok_s": statistics.median(rates), "runs": rates,
              "cpu_ms_per_token": statistics.median(cpu_ms),
              "bytes_per_token": weight_bytes_per_token(engine.engine_core.runner.model),
              "kv_bytes_per_token": kv_bytes_per_token(engine, args.prompt + args.tokens / 2)}
    del engine
    gc.collect()
    return result


def decode_rate(marks: list[tuple[float, float, int]]) -> tuple[float, float]:
    """(tokens a second, CPU ms a token) of a request's decode from its steps' marks (wall
    time, CPU time, tokens out after the step). The decode starts at the step that gave the
    first token: a prompt longer than a step's token budget (chunked prefill, 2,048 tokens by
    default) takes more than one step to give it, and those steps are its prefill."""
    start = next((i for i, (_, _, tokens) in enumerate(marks) if tokens), None)
    if start is None or marks[-1][2] <= marks[start][2]:
        raise ValueError("decode_rate needs a request that decoded at least 2 tokens")
    (wall0, cpu0, first), (wall1, cpu1, last) = marks[start], marks[-1]
    decoded = last - first
    return decoded / (wall1 - wall0), 1e3 * (cpu1 - cpu0) / decoded


def llama_bench(bin_dir: Path, path: str, threads: int | None,
                args: argparse.Namespace, repeats: int) -> list[float]:
    """llama.cpp's bs=1 decode on the same file: llama-bench -p 0 -n TOKENS -d PROMPT -r REPEATS
    (its tok/s samples), decoding after as many tokens of context as Strand's prompt."""
    cmd = [str(bin_dir / "llama-bench"), "-m", path, "-p", "0", "-n", str(args.tokens), "-d",
           str(args.prompt), "-r", str(repeats), "-o", "json"] + (
               [] if threads is None else ["-t", str(threads)])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return parse_llama_bench(out).get("decode", [])


def llama_turn(bin_dir: Path, path: str, threads: int | None, args: argparse.Namespace,
               samples: list[float]) -> None:
    """One llama-bench run (-r 1) on the same file, its tok/s added to `samples`."""
    samples.extend(llama_bench(bin_dir, path, threads, args, 1))


def turn_ratios(strand: list[float], llama: list[float]) -> list[float]:
    """Strand's tok/s over llama.cpp's, turn by turn (each pair measured a minute apart at
    most); empty where the two did not take turns (a sample each a turn)."""
    if not llama or len(strand) != len(llama):
        return []
    return [s / ll for s, ll in zip(strand, llama, strict=True)]


def bandwidth_bound(threads: int | None) -> float:
    """The machine's copy rate (bytes/s) with `threads` threads: what a decode step that reads
    its weights once can reach at most."""
    import torch

    from benchmarks.roofline import measure_bandwidth

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        return measure_bandwidth()
    finally:
        torch.set_num_threads(before)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a .gguf file or a short name")
    parser.add_argument("--threads", type=int, nargs="+", default=None,
                        help="thread counts, one set of rows each (default: torch's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--tokens", type=int, default=64, help="decoded tokens")
    parser.add_argument("--no-q8", action="store_true", help="skip the Q8_0 copy")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bfloat16"],
                        help="Strand's KV cache (auto: float32, the model's dtype)")
    parser.add_argument("--no-float32", action="store_true",
                        help="skip the dequantized float32 row (a model too large for it)")
    parser.add_argument("--llama-cpp", type=Path, default=None,
                        help="directory holding llama-bench: adds llama.cpp on the same files")
    parser.add_argument("--isa", default="native", choices=list(isa_emulation.ISAS),
                        help="avx2: every library capped at AVX2 (benchmarks/isa_emulation.py)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    isa_emulation.run_capped(args.isa, "benchmarks.quantized", argv)
    for name in ("repeats", "prompt"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.tokens < 2:
        parser.error("--tokens must be >= 2 (the decode rate is of the tokens after the first)")
    if args.threads is not None and min(args.threads) < 1:
        parser.error("--threads must be >= 1")
    if args.llama_cpp is not None and not (args.llama_cpp / "llama-bench").is_file():
        parser.error(f"--llama-cpp must be a directory holding llama-bench, got {args.llama_cpp}")
    if args.llama_cpp is not None:
        isa_emulation.check_llama_cpp(args.llama_cpp, args.isa)
    from strand.engine_core.default_model import gguf_file

    source = gguf_file(args.model)
    if source is None:
        parser.error(f"--model must name a .gguf file, got {args.model!r}")
    configs = [("float32 (dequantized)", source, None), ("packed (the file's types)", source,
                                                         "gguf")][int(args.no_float32):]
    if not args.no_q8:
        q8 = requantize(Path(source), Path(source).with_suffix(".requantized-Q8_0.gguf"))
        configs.append(("packed Q8_0 (re-quantized)", str(q8), "gguf"))
    runs: dict[str, Any] = {}
    rows = []
    for threads in args.threads or [None]:
        results: dict[str, Any] = {}
        for label, path, quantization in configs:
            log(f"measuring {label}, {threads or 'default'} threads: {Path(path).name}")
            peer: list[float] = []
            turn = None  # llama.cpp's turn after each of Strand's timed requests
            if args.llama_cpp is not None and quantization is not None:
                log(f"  taking turns with llama.cpp on {Path(path).name}")
                turn = functools.partial(llama_turn, args.llama_cpp, path, threads, args, peer)
            results[label] = measure(path, quantization, threads, args, turn)
            if turn is not None:
                results[label]["llama_cpp_tok_s"] = peer
        bandwidth = bandwidth_bound(threads)
        base = results.get("float32 (dequantized)")
        for label, r in results.items():
            read = r["bytes_per_token"] + r["kv_bytes_per_token"]
            bound = bandwidth / read
            r["bandwidth_bytes_s"], r["bound_tok_s"] = bandwidth, bound
            llama = r.get("llama_cpp_tok_s") or []
            turns = turn_ratios(r["runs"], llama)
            if turns:
                r["turn_ratios"] = turns
            rows.append([str(threads or "default"), label, f"{r['decode_tok_s']:.1f}",
                         f"{r['cpu_ms_per_token']:.1f}",
                         f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x" if base else "",
                         f"{read / 1e6:.1f}",
                         f"{r['decode_tok_s'] / bound:.0%} of {bound:.0f}",
                         f"{statistics.median(llama):.1f}" if llama else "",
                         f"{r['decode_tok_s'] / statistics.median(llama):.2f}x" if llama else "",
                         (f"{statistics.median(turns):.2f}x ({min(turns):.2f}-{max(turns):.2f})"
                          if turns else "")])
        runs[str(threads or "default")] = results
    print(format_table(["threads", "weights", "bs=1 decode tok/s", "CPU ms/token", "vs float32",
                        "MB read/token",
                        "of the bandwidth bound", "llama.cpp tok/s", "vs llama.cpp",
                        "turn by turn"], rows))
    if args.isa != "native":
        print(f"\nStrand, torch, oneDNN and MKL restricted to {args.isa} "
              f"(benchmarks/isa_emulation.py); ran at {isa_emulation.observed()}")
    write_json(args.out, {"benchmark": "quantized", "model": source, "threads": args.threads,
                          "isa": args.isa, "kv_cache_dtype": args.kv_cache_dtype,
                          "prompt": args.prompt, "tokens": args.tokens, "results": runs})


if __name__ == "__main__":
    main()
