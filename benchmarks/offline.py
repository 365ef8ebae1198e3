"""Offline throughput (like `vllm bench throughput`): strand in-process and through the gateway,
HF static `generate` and HF `generate_batch`, on one workload, with the machine's bound.

    python -m benchmarks.offline --output-json results/offline.json          # the standard workload
    python -m benchmarks.offline --num-prompts 8 --output-len 32 --num-layers 2 --backends strand,hf-static

The defaults are the standard CPU workload: random-weight Llama (8 layers, hidden 512, 8/4 heads,
vocab 32000), 64 prompts of 16-512 tokens, 128 output tokens, greedy, ignore_eos, float32.
"""

from __future__ import annotations

import argparse
import gc
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    DTYPE_BYTES,
    BackendResult,
    add_model_args,
    format_table,
    load_config,
    log,
    resolve_device,
    resolve_model,
    set_threads,
    write_json,
)
from benchmarks.datasets import SampleRequest, add_dataset_args, dataset_from_args, describe_dataset
from benchmarks.roofline import (
    ModelShape,
    add_roofline_args,
    fractions,
    measure_machine,
    workload_bound,
)
from benchmarks.strand_backends import StrandSettings, kv_bytes_per_token, kv_cache_bytes

BACKENDS = ("strand", "strand-gateway", "hf-static", "hf-continuous")
# (backend, peer, minimum ratio of output tokens/s): the goals for the standard workload.
RATIO_GOALS = (("strand", "hf-static", 2.0), ("strand", "hf-continuous", 3.0),
               ("strand-gateway", "strand", 0.9))
COMPUTE_BOUND_GOAL = 0.5
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    add_dataset_args(parser)
    add_roofline_args(parser)
    group = parser.add_argument_group("backends")
    group.add_argument("--backends", default=",".join(BACKENDS),
                       help=f"comma-separated, from {', '.join(BACKENDS)}")
    group.add_argument("--max-num-seqs", type=int, default=256)
    group.add_argument("--max-num-batched-tokens", type=int, default=2048)
    group.add_argument("--no-prefix-caching", action="store_true")
    group.add_argument("--kv-cache-memory", type=int, default=None,
                       help="bytes of KV cache (strand and hf-continuous); default: the "
                            "whole workload fits at once")
    group.add_argument("--hf-batch-size", type=int, default=16, help="hf-static batch size")
    group.add_argument("--gateway", default=None,
                       help="address of a running gateway (its mode picks the path); default: "
                            "start a stack")
    group.add_argument("--gateway-path", choices=("streams", "step"), default="streams",
                       help="a stack started here: 'streams' = auto-step gateway, one Generate "
                            "stream per request (the faster); 'step' = manual-step gateway, "
                            "the in-process add/step loop")
    group.add_argument("--num-threads", type=int, default=None,
                       help="torch threads for every backend (default: torch's own)")
    parser.add_argument("--output-json", type=Path, default=None)
    return parser


def parse_backends(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown or not names:
        raise ValueError(f"backends must be a non-empty list from {', '.join(BACKENDS)}, "
                         f"got {text!r}")
    return names


def run(args: argparse.Namespace) -> dict[str, Any]:
    backends = parse_backends(args.backends)
    threads = set_threads(args.num_threads)
    device = resolve_device(args.device)
    model_dir = resolve_model(args)
    config = load_config(model_dir)
    requests = dataset_from_args(args, config["vocab_size"])
    kv_bytes = args.kv_cache_memory or kv_cache_bytes(config, requests, DTYPE_BYTES[args.dtype])
    settings = StrandSettings(dtype=args.dtype, device=device, max_num_seqs=args.max_num_seqs,
                              max_num_batched_tokens=args.max_num_batched_tokens,
                              enable_prefix_caching=not args.no_prefix_caching,
                              kv_cache_memory=kv_bytes)
    dataset = describe_dataset(args, requests)
    log(f"workload: {dataset['num_prompts']} prompts of {dataset['prompt_len_min']}-"
        f"{dataset['prompt_len_max']} tokens, {dataset['output_len_max']} output tokens; "
        f"model {model_dir}; {threads} threads; backends {', '.join(backends)}")
    # Measured before and after the backends (best of both): the bound must not look easy
    # because the machine happened to be busy at one moment.
    rates = None
    if not args.no_bound:
        rates = measure_machine(args.gemm_size, args.copy_mib * 1024**2, args.dtype,
                                device=device)
    results: list[BackendResult] = []
    for name in backends:
        log(f"[{len(results) + 1}/{len(backends)}] {name}")
        result = _run_backend(name, _runner(name, args, str(model_dir), requests, settings,
                                            threads, kv_bytes))
        if result.ok:
            log(f"  {result.output_tokens_per_s:.1f} output tokens/s in {result.elapsed_s:.1f}s")
        else:
            log(f"  {result.status}")
        results.append(result)
        gc.collect()
    bound = None
    if rates is not None:
        rates = measure_machine(args.gemm_size, args.copy_mib * 1024**2, args.dtype, rates,
                                device)
        bound = workload_bound(rates, ModelShape.from_config(config), requests,
                               min(args.max_num_seqs, len(requests)))
    return report(args, model_dir, dataset, results, bound, threads)


def _runner(name: str, args: argparse.Namespace, model_dir: str, requests: list[SampleRequest],
            settings: StrandSettings, threads: int,
            kv_bytes: int) -> Callable[[], BackendResult]:
    # Imported per backend: the HF peers need transformers, the gateway needs services.
    if name == "strand":
        from benchmarks.strand_backends import run_inprocess

        return lambda: run_inprocess(model_dir, requests, settings)
    if name == "strand-gateway":
        from benchmarks.strand_backends import run_gateway

        return lambda: run_gateway(model_dir, requests, settings, args.gateway, threads,
                                   args.gateway_path)
    from benchmarks import hf_backends

    if name == "hf-static":
        return lambda: hf_backends.run_hf_static(model_dir, requests, args.dtype,
                                                 args.hf_batch_size, settings.device)
    kv_tokens = kv_bytes // kv_bytes_per_token(load_config(Path(model_dir)),
                                               DTYPE_BYTES[args.dtype])
    return lambda: hf_backends.run_hf_continuous(
        model_dir, requests, args.dtype, args.max_num_batched_tokens, args.max_num_seqs,
        kv_cache_tokens=int(kv_tokens), device=settings.device)


def _run_backend(name: str, runner: Callable[[], BackendResult]) -> BackendResult:
    """A backend that fails is reported as failed; the others still run."""
    try:
        return runner()
    except Exception as exc:  # noqa: BLE001 - any failure is a result to report, not a crash
        log(f"  {name} failed: {type(exc).__name__}: {exc}")
        return BackendResult(backend=name, status=f"failed: {type(exc).__name__}: {exc}")


def report(args: argparse.Namespace, model_dir: Path, dataset: dict[str, Any],
           results: list[BackendResult], bound: dict[str, Any] | None,
           threads: int) -> dict[str, Any]:
    ok = {r.backend: r for r in results if r.ok}
    reference = next(iter(ok.values()), None)
    backends: dict[str, Any] = {}
    for r in results:
        entry = r.summary()
        if r.ok:
            entry["vs"] = {peer: r.output_tokens_per_s / p.output_tokens_per_s
                           for peer, p in ok.items()
                           if peer != r.backend and p.output_tokens_per_s > 0}
            if reference is not None:
                entry["same_tokens_as"] = {reference.backend: _agreement(r, reference)}
            if bound is not None:
                entry.update(fractions(bound, r.elapsed_s))
        backends[r.backend] = entry
    data = {
        "benchmark": "offline",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "num_threads": threads, **_device()},
        "model": {"path": str(model_dir), "dtype": args.dtype,
                  **{k: v for k, v in load_config(model_dir).items()
                     if k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                              "num_key_value_heads", "intermediate_size", "vocab_size")}},
        "dataset": dataset,
        "backends": backends,
        "bound": bound,
        "goals": goals(ok, bound),
    }
    return data


def goals(ok: dict[str, BackendResult], bound: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's goals that this run can judge (both sides present)."""
    out: list[dict[str, Any]] = []
    for name, peer, minimum in RATIO_GOALS:
        if name in ok and peer in ok and ok[peer].output_tokens_per_s > 0:
            value = ok[name].output_tokens_per_s / ok[peer].output_tokens_per_s
            out.append({"goal": f"{name} output tokens/s >= {minimum}x {peer}",
                        "value": value, "met": value >= minimum})
    if bound is not None and "strand" in ok:
        value = fractions(bound, ok["strand"].elapsed_s)["fraction_of_compute_bound"]
        out.append({"goal": f"strand >= {COMPUTE_BOUND_GOAL:.0%} of the compute bound",
                    "value": value, "met": value >= COMPUTE_BOUND_GOAL})
    return out


def _agreement(result: BackendResult, reference: BackendResult) -> float:
    """Share of requests whose greedy tokens equal the reference's (numerics can differ)."""
    pairs = list(zip(result.outputs, reference.outputs, strict=True))
    return sum(1 for a, b in pairs if a == b) / len(pairs) if pairs else 0.0


def _device() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        return {"device": torch.cuda.get_device_name(0)}
    return {"device": "cpu"}


def summary_table(data: dict[str, Any]) -> str:
    headers = ["backend", "status", "req/s", "out tok/s", "total tok/s", "x strand",
               "% compute bound"]
    rows: list[list[str]] = []
    for name, b in data["backends"].items():
        if b["status"] != "ok":
            rows.append([name, b["status"][:60], "-", "-", "-", "-", "-"])
            continue
        vs = b["vs"].get("strand")
        frac = b.get("fraction_of_compute_bound")
        rows.append([name, "ok" if not b["num_failed"] else f"{b['num_failed']} failed",
                     f"{b['requests_per_s']:.2f}", f"{b['output_tokens_per_s']:.1f}",
                     f"{b['total_tokens_per_s']:.1f}",
                     "1.00" if name == "strand" else (f"{vs:.2f}" if vs else "-"),
                     f"{100 * frac:.0f}%" if frac is not None else "-"])
    lines = [format_table(headers, rows)]
    gateway = data["backends"].get("strand-gateway", {})
    if gateway.get("settings", {}).get("path"):
        lines.append(f"strand-gateway path: {gateway['settings']['path']}")
    bound = data["bound"]
    if bound is not None:
        machine = bound["machine"]
        library = f" ({machine['gemm_library']})" if machine.get("gemm_library") else ""
        lines.append(f"machine: GEMM {machine['gemm_flops_per_s'] / 1e9:.1f} GFLOP/s{library}, copy "
                     f"{machine['memory_bytes_per_s'] / 1e9:.1f} GB/s, "
                     f"{machine['num_threads']} threads; bound "
                     f"{bound['bound_total_tokens_per_s']:.0f} total tok/s "
                     f"({bound['limited_by']}-limited)")
    for goal in data["goals"]:
        lines.append(f"goal {'MET' if goal['met'] else 'NOT MET'}: {goal['goal']} "
                     f"(got {goal['value']:.2f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    data = run(args)
    write_json(args.output_json, data)
    print(summary_table(data))


if __name__ == "__main__":
    main()
