"""What every benchmark shares: the model to run (given or built), results, percentiles, output."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Bytes per element of the dtypes the benchmarks take.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# The standard CPU workload's model: random-weight Llama, 8 layers, hidden 512, 8/4 heads.
STANDARD_MODEL = {"arch": "llama", "num_layers": 8, "hidden_size": 512, "num_heads": 8,
                  "num_kv_heads": 4, "vocab_size": 32000}
# Published models' shapes, built with random weights (the GPU measurements use these two).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {"arch": "qwen2", "num_layers": 24, "hidden_size": 896, "num_heads": 14,
                     "num_kv_heads": 2, "vocab_size": 151936, "intermediate_size": 4864,
                     "tie_word_embeddings": True, "max_position_embeddings": 32768,
                     "rope_theta": 1000000.0},
    "llama-3.2-1b": {"arch": "llama", "num_layers": 16, "hidden_size": 2048, "num_heads": 32,
                     "num_kv_heads": 8, "vocab_size": 128256, "intermediate_size": 8192,
                     "tie_word_embeddings": True, "max_position_embeddings": 131072,
                     "rope_theta": 500000.0,
                     "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}},
}
DEFAULT_MODEL_CACHE = Path(os.environ.get("STRAND_BENCH_MODELS", "/tmp/strand-bench-models"))


@dataclass(slots=True)
class BackendResult:
    """One backend's run of the whole workload. Times in seconds, rates per second."""

    backend: str
    status: str = "ok"  # "ok" | "unavailable: <why>" | "failed: <why>"
    elapsed_s: float = 0.0
    num_requests: int = 0
    num_failed: int = 0  # requests that errored or returned fewer tokens than asked
    prompt_tokens: int = 0
    output_tokens: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    outputs: list[list[int]] = field(default_factory=list)  # per request, in dataset order

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        total = self.prompt_tokens + self.output_tokens
        return total / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        del data["outputs"]  # token ids are for the agreement check, not the report
        data.update(requests_per_s=self.requests_per_s,
                    output_tokens_per_s=self.output_tokens_per_s,
                    total_tokens_per_s=self.total_tokens_per_s)
        return data


def add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model (built when --model is absent)")
    group.add_argument("--model", default=None, help="a local HF directory")
    group.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                       help="one dtype for every backend")
    group.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                       help="one device for every backend; auto: cuda when available")
    group.add_argument("--preset", default=None, choices=sorted(MODEL_PRESETS),
                       help="a published model's shape with random weights (replaces --arch "
                            "and the other shape flags)")
    group.add_argument("--arch", default=STANDARD_MODEL["arch"])
    group.add_argument("--num-layers", type=int, default=STANDARD_MODEL["num_layers"])
    group.add_argument("--hidden-size", type=int, default=STANDARD_MODEL["hidden_size"])
    group.add_argument("--num-heads", type=int, default=STANDARD_MODEL["num_heads"])
    group.add_argument("--num-kv-heads", type=int, default=STANDARD_MODEL["num_kv_heads"])
    group.add_argument("--vocab-size", type=int, default=STANDARD_MODEL["vocab_size"])
    group.add_argument("--model-cache-dir", type=Path, default=DEFAULT_MODEL_CACHE,
                       help="where built models are kept, one directory per shape")


def resolve_model(args: argparse.Namespace) -> Path:
    """--model as given, or a random-weight model of the requested shape (built once, reused)."""
    if args.model:
        path = Path(args.model)
        if not (path / "config.json").is_file():
            raise ValueError(f"model must be a directory with config.json, got {args.model!r}")
        return path
    preset = getattr(args, "preset", None)
    if preset:
        shape = dict(MODEL_PRESETS[preset])
        name = preset
    else:
        shape = {"arch": args.arch, "num_layers": args.num_layers,
                 "hidden_size": args.hidden_size, "num_heads": args.num_heads,
                 "num_kv_heads": args.num_kv_heads, "vocab_size": args.vocab_size}
        name = f"{args.arch}-{args.num_layers}x{args.hidden_size}"
    spec = {**shape, "dtype": args.dtype}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    out = Path(args.model_cache_dir) / f"{name}-{key}"
    if not (out / "tokenizer.json").is_file():
        from strand.testing.tiny_model import make_tiny_model

        log(f"building a random-weight model at {out}")
        make_tiny_model(out, dtype=args.dtype, seed=0, **shape)
    return out


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device must be cpu or auto on a machine without CUDA, got 'cuda'")
    return name


def load_config(model_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return config


def set_threads(num_threads: int | None) -> int:
    """One thread count for every backend in this process (and the stack's processes)."""
    import torch

    if num_threads is not None:
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        torch.set_num_threads(num_threads)
    return int(torch.get_num_threads())


def percentiles(values: list[float], points: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    """Linear-interpolated percentiles (numpy's default), plus the mean; zeros when empty."""
    result: dict[str, float] = {}
    ordered = sorted(values)
    result["mean"] = sum(ordered) / len(ordered) if ordered else 0.0
    for p in points:
        result[f"p{p}"] = _percentile(ordered, p)
    return result


def _percentile(ordered: list[float], p: float) -> float:
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * p / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=2, sort_keys=False)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    log(f"results written to {path}")


def blocks_holding(tokens: Sequence[int], block_size: int = 16) -> int:
    """KV cache blocks that hold requests of these token counts (prompt + output each) at once,
    whole blocks each, plus the block the engine reserves: what a batch benchmark gives Strand
    (num_gpu_blocks_override, or kv_cache_memory) where llama.cpp gets -c of their total. The CPU
    default budget (kv_cache_memory) is not sized for a workload: a batch that does not fit
    measures requests waiting for blocks instead of the batch."""
    return sum(-(-n // block_size) for n in tokens) + 1


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def log(message: str) -> None:
    # Progress goes to stderr so stdout stays the table alone.
    print(message, file=sys.stderr, flush=True)


def ended_badly(name: str, out: Any) -> bool:
    """True (and a log line) when a request's output carries an error, or it finished other than
    by length or stop."""
    completion = out.outputs[0] if out.outputs else None
    if out.error is None and (not out.finished or (
            completion is not None and completion.finish_reason in ("length", "stop"))):
        return False
    reason = completion.finish_reason if completion is not None else None
    log(f"{name}: request {out.request_id} ended with {reason}: {out.error}")
    return True
