"""Prefill speed as a fraction of the device's measured GEMM rate (the compute bound).

    python -m benchmarks.gpu_prefill --preset llama-3.2-1b --dtype bfloat16 --prompt-len 2048 \
        --num-prompts 4

Each repeat adds --num-prompts random prompts of --prompt-len tokens (no shared prefix, prefix
caching off) and times the one engine step that prefills all of them and samples their first
tokens. Work counted: 2 x matmul weights x tokens (layers), 2 x lm_head x prompts (logits only
at each prompt's last token), and causal attention (QK^T and PV: 2 x 2 x heads x head_dim x
L(L+1)/2 per layer and prompt). The bound is that work at the rate of a square --gemm-size
product in the same dtype on the same device, measured before and after (the better kept).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from benchmarks.common import (
    add_model_args,
    format_table,
    load_config,
    log,
    resolve_device,
    resolve_model,
)
from benchmarks.roofline import ModelShape, measure_gemm


def prefill_flops(shape: ModelShape, prompt_len: int, num_prompts: int) -> float:
    tokens = prompt_len * num_prompts
    attention = (4.0 * shape.num_layers * shape.num_heads * shape.head_dim
                 * prompt_len * (prompt_len + 1) / 2 * num_prompts)
    return 2.0 * shape.layer_params * tokens + 2.0 * shape.lm_head_params * num_prompts + attention


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from strand.engine_core import EngineArgs, LLMEngine, SamplingParams

    device = resolve_device(args.device)
    model_dir = resolve_model(args)
    config = load_config(model_dir)
    shape = ModelShape.from_config(config)
    tokens = args.prompt_len * args.num_prompts
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), dtype=args.dtype, device=device, max_num_seqs=args.num_prompts,
        max_model_len=args.prompt_len + 8, max_num_batched_tokens=tokens,
        enable_prefix_caching=False))
    rate = measure_gemm(args.gemm_size, args.dtype, device=device)
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    times = []
    for repeat in range(args.repeats + 1):  # the first one warms up
        for i in range(args.num_prompts):
            prompt = [rng.randrange(3, config["vocab_size"]) for _ in range(args.prompt_len)]
            engine.add_request(f"{repeat}-{i}", {"prompt_token_ids": prompt}, params)
        _sync(device)
        start = time.perf_counter()
        outputs = engine.step()
        _sync(device)
        elapsed = time.perf_counter() - start
        if len(outputs) != args.num_prompts or not all(o.finished for o in outputs):
            raise RuntimeError(f"one step should prefill all {args.num_prompts} prompts and "
                               f"finish them; got {len(outputs)} outputs")
        if repeat:
            times.append(elapsed)
    rate = max(rate, measure_gemm(args.gemm_size, args.dtype, device=device))
    step_s = statistics.median(times)
    flops = prefill_flops(shape, args.prompt_len, args.num_prompts)
    return {"model": str(model_dir), "device": device, "dtype": args.dtype,
            "prompt_len": args.prompt_len, "num_prompts": args.num_prompts,
            "step_ms": 1e3 * step_s, "tokens_per_s": tokens / step_s,
            "tflops": flops / step_s / 1e12, "gemm_tflops": rate / 1e12,
            "fraction_of_bound": flops / step_s / rate}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gemm-size", type=int, default=8192)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.prompt_len < 1 or args.num_prompts < 1 or args.repeats < 1:
        parser.error("--prompt-len, --num-prompts and --repeats must be >= 1")
    r = run(args)
    log(f"prefill: {r['num_prompts']} x {r['prompt_len']} tokens, {r['model']} ({r['dtype']}) "
        f"on {r['device']}")
    print(format_table(["step ms", "prefill tok/s", "TFLOP/s", "GEMM TFLOP/s", "% of bound"],
                       [[f"{r['step_ms']:.2f}", f"{r['tokens_per_s']:.0f}", f"{r['tflops']:.1f}",
                         f"{r['gemm_tflops']:.1f}", f"{100 * r['fraction_of_bound']:.0f}%"]]))


if __name__ == "__main__":
    main()
