"""Memory and load time of Strand and llama.cpp on the same GGUF file, in one run:

    python -m benchmarks.memory --gguf FILE.gguf --llama-cpp BIN_DIR [--dtype float32]
        [--quantization gguf] [--ctx 2048] [--threads N] [--out results.json]

The file is read once first, so that each backend loads it from the page cache; then each loads
it in a process of its own, with a KV cache of --ctx tokens, and decodes 32 tokens of a short
prompt:
  strand     LLM(model=FILE, dtype=..., quantization=...) in a worker process: the load time is
             LLM()'s, the peak RSS the worker's VmHWM once the tokens are out;
  llama.cpp  llama-server -m FILE -c CTX (built by `python -m benchmarks.cpu_peers_setup`): the
             load time is from its start to /health answering 200, the peak its VmHWM after one
             32-token completion.
Strand's row also gives its runtime's own baseline (RSS after importing torch and the engine and
loading the C++ kernels, before the model) and the goal: peak <= 1.1 x weight bytes + KV cache
+ baseline, where the weight bytes count each weight once in the form the engine reads it (the
file's blocks as packed for --quantization gguf; the parameters in --dtype otherwise) and the KV
cache is --ctx tokens in the engine's cache dtype. "kept" is every tensor the model holds, a
second copy of a weight included. llama.cpp keeps its cache in float16.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.common import format_table, log, write_json
from benchmarks.llama_server import LlamaServer

PROMPT = "The history of the printing press begins"
NEW_TOKENS = 32


def _status_mib(pid: int | str = "self") -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MiB."""
    values: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key = line.split(":")[0]
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(line.split()[1]) / 1024
    return values


def strand_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from strand import LLM, SamplingParams
    from strand.engine_core.model_executor.gguf.convert import gguf_to_hf_dir
    from strand.kernels._cpu_build import KERNELS

    torch.set_num_threads(args.threads)
    KERNELS.module()
    baseline = _status_mib()["VmRSS"]
    config = json.loads((gguf_to_hf_dir(args.gguf) / "config.json").read_text())
    kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    value_bytes = 2 if args.dtype == "bfloat16" else 4
    kv_bytes = 2 * config["num_hidden_layers"] * kv_heads * head_dim * value_bytes * args.ctx
    started = time.perf_counter()
    llm = LLM(model=str(args.gguf), dtype=args.dtype, max_model_len=args.ctx,
              kv_cache_memory=kv_bytes,
              quantization=None if args.quantization == "none" else args.quantization)
    load_s = time.perf_counter() - started
    loaded = _status_mib()["VmRSS"]
    llm.generate([PROMPT], SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0,
                                          ignore_eos=True), use_tqdm=False)
    model = llm.engine.engine_core.runner.model
    return {"load_s": load_s, "baseline_mib": baseline, "loaded_mib": loaded,
            "peak_mib": _status_mib()["VmHWM"], "kv_mib": kv_bytes / 2**20,
            "weights_mib": _weight_bytes(model) / 2**20,
            "kept_mib": _kept_weight_bytes(model) / 2**20}


def _kept_weight_bytes(model: Any) -> int:
    """Bytes of every distinct tensor the model keeps: parameters, buffers and packed copies
    (oneDNN's blocked copy beside a dense bfloat16 weight counts, as it is resident)."""
    seen: set[int] = set()
    return sum(_nbytes(t, seen) for module in model.modules()
               for t in _tensors(module, packed=True))


def _weight_bytes(model: Any) -> int:
    """The weights' bytes, each weight once, in the form the engine reads it: a dense linear
    layer's weight in the model's dtype (whether kept dense, in panels, in oneDNN's blocks or
    in several of these), a GGUF layer's blocks, every other parameter and buffer as kept.
    The goal is stated over these: a second resident copy is what it counts against."""
    from strand.engine_core.model_executor.layers.linear import Linear

    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, Linear):
            dense = module.weight
            if dense.is_meta or dense.data_ptr() not in seen:  # a tied table: the same bytes
                total += module.in_features * module.out_features * dense.element_size()
            if not dense.is_meta:
                seen.add(dense.data_ptr())
            total += sum(_nbytes(t, seen) for t in _tensors(module, packed=False)
                         if t is not module.weight)
            continue
        total += sum(_nbytes(t, seen) for t in _tensors(module, packed=True))
    return total


def _tensors(module: Any, packed: bool) -> list[Any]:
    import torch

    found = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    if packed:
        found.append(getattr(module, "packed", None))
    return [t for t in found if isinstance(t, torch.Tensor) and not t.is_meta]


def _nbytes(t: Any, seen: set[int]) -> int:
    """t's bytes, or 0 where a tensor of the same memory was counted already."""
    key = id(t) if t.is_mkldnn else t.data_ptr()  # oneDNN's blocked copy has no storage
    if key in seen:
        return 0
    seen.add(key)
    return int(t.numel() * t.element_size())


def llama_server(args: argparse.Namespace) -> dict[str, Any]:
    server = LlamaServer(args.llama_cpp, args.gguf, 1, args.threads, args.ctx)
    try:
        loaded = _status_mib(server.pid)["VmRSS"]
        body = json.dumps({"prompt": PROMPT, "n_predict": NEW_TOKENS, "temperature": 0,
                           "ignore_eos": True}).encode()
        request = urllib.request.Request(f"http://{server.address}/completion", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as resp:
            resp.read()
        return {"load_s": server.load_s, "loaded_mib": loaded,
                "peak_mib": _status_mib(server.pid)["VmHWM"]}
    finally:
        server.stop()


def warm_page_cache(path: Path, chunk: int = 64 * 2**20) -> None:
    """Read the file once, so that both backends load it from the page cache: whichever ran
    first would otherwise pay the disk read alone in its load time."""
    log(f"reading {path.name} once into the page cache")
    with path.open("rb", buffering=0) as f:
        while f.read(chunk):
            pass


def run(args: argparse.Namespace) -> dict[str, Any]:
    warm_page_cache(args.gguf)
    log(f"strand: {args.gguf.name}, dtype {args.dtype}, quantization {args.quantization}")
    argv = sys.argv[1:] if args.argv is None else args.argv
    done = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--worker", *argv],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the strand worker failed: {done.stderr.strip()[-2000:]}")
    strand = json.loads(done.stdout.strip().splitlines()[-1])
    report: dict[str, Any] = {"file": str(args.gguf), "file_mib": args.gguf.stat().st_size / 2**20,
                              "dtype": args.dtype, "quantization": args.quantization,
                              "ctx": args.ctx, "threads": args.threads, "strand": strand}
    if args.llama_cpp is not None:
        log("llama.cpp: llama-server")
        report["llama.cpp"] = llama_server(args)
    return report


def print_table(report: dict[str, Any]) -> None:
    s = report["strand"]
    goal = 1.1 * s["weights_mib"] + s["kv_mib"] + s["baseline_mib"]
    rows = [["strand", f"{s['load_s']:.1f}", f"{s['loaded_mib']:.0f}", f"{s['peak_mib']:.0f}",
             f"{s['weights_mib']:.0f}", f"{s['kept_mib']:.0f}", f"{s['kv_mib']:.0f}",
             f"{s['baseline_mib']:.0f}",
             f"{goal:.0f} ({s['peak_mib'] / goal:.2f}x)"]]
    if "llama.cpp" in report:
        c = report["llama.cpp"]
        rows.append(["llama.cpp", f"{c['load_s']:.1f}", f"{c['loaded_mib']:.0f}",
                     f"{c['peak_mib']:.0f}", "", "", "", "", ""])
    print(f"{Path(report['file']).name} ({report['file_mib']:.0f} MiB), strand dtype "
          f"{report['dtype']}, quantization {report['quantization']}, {report['ctx']} tokens "
          f"of KV cache, {report['threads']} threads")
    print(format_table(["backend", "load s", "RSS loaded MiB", "peak RSS MiB", "weights MiB",
                        "kept MiB", "KV MiB", "baseline MiB", "goal MiB (peak/goal)"], rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, required=True, help="the model file")
    parser.add_argument("--llama-cpp", type=Path, default=None,
                        help="directory holding llama-server (none: Strand alone)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--quantization", default="none", choices=["none", "gguf"])
    parser.add_argument("--ctx", type=int, default=2048, help="tokens of KV cache")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = argv
    if args.worker:
        print(json.dumps(strand_worker(args)))
        return
    if args.llama_cpp is not None and not (args.llama_cpp / "llama-server").is_file():
        parser.error(f"{args.llama_cpp / 'llama-server'} is missing: run "
                     "python -m benchmarks.cpu_peers_setup")
    report = run(args)
    print_table(report)
    write_json(args.out, report)


if __name__ == "__main__":
    main()
