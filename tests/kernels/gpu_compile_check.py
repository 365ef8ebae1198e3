"""Compile every kernel variant to an sm_90 cubin with Triton's bundled ptxas; no GPU needed.

Run in a fresh process (`python -m tests.kernels.gpu_compile_check`): Triton fixes at import
whether its own library functions are interpreted, so a process that imported Triton under
TRITON_INTERPRET=1 cannot compile. Prints {variant: "ok" | error} as JSON.
"""

from __future__ import annotations

import json
import os
from typing import Any

from strand.kernels import gguf_linear_triton, kv_write, lora, paged_attention, rms_norm, rotary
from strand.kernels._triton import LazyKernel

DTYPES = ("fp32", "fp16", "bf16")


def _paged_variant(dtype: str, split_kv: bool, num_reqs_is_one: bool,
                   window_softcap: bool = False) -> tuple[Any, ...]:
    pointers = {"out_ptr": f"*{dtype}", "q_ptr": f"*{dtype}", "kv_ptr": f"*{dtype}",
                "part_acc_ptr": "*fp32", "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32",
                "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32", "block_table_ptr": "*i32",
                "scale": "fp32", "softcap": "fp32"}
    constants: dict[str, Any] = dict(
        QUERIES_PER_KV=4, BLOCK_Q=4, BLOCK_M=16, TILE_N=64, HEAD_DIM_PAD=128,
        NUM_SPLITS=4 if split_kv else 1, SPLIT_KV=split_kv,
        DOT_PRECISION="ieee" if dtype == "fp32" else None,
        USE_WINDOW=window_softcap, USE_SOFTCAP=window_softcap)
    if num_reqs_is_one:  # Triton turns an int argument equal to 1 into a constant
        constants["num_reqs"] = 1
    return paged_attention._paged_attn_kernel, pointers, constants


def variants() -> dict[str, tuple[Any, ...]]:
    """name -> (kernel, non-int32 argument types, constexpr values)."""
    table: dict[str, tuple[Any, ...]] = {}
    for dt in DTYPES:
        for split in (False, True):
            for one in (False, True):
                name = f"paged_attention-{dt}-{'split' if split else 'one_pass'}-{one and 'one_req' or 'many_reqs'}"
                table[name] = _paged_variant(dt, split, one)
            # Gemma's sliding window and logit soft-capping.
            table[f"paged_attention-{dt}-{'split' if split else 'one_pass'}-window_softcap"] = (
                _paged_variant(dt, split, False, window_softcap=True))
        table[f"split_kv_reduce-{dt}"] = (
            paged_attention._split_kv_reduce_kernel,
            {"out_ptr": f"*{dt}", "part_acc_ptr": "*fp32", "part_max_ptr": "*fp32",
             "part_sum_ptr": "*fp32", "query_start_loc_ptr": "*i32"},
            dict(NUM_SPLITS=4, SPLITS_PAD=4, HEAD_DIM_PAD=128))
        table[f"write_kv-{dt}"] = (
            kv_write._write_kv_kernel,
            {"key_ptr": f"*{dt}", "value_ptr": f"*{dt}", "kv_ptr": f"*{dt}",
             "slot_mapping_ptr": "*i64"},
            dict(HEADS_PAD=8, HEAD_DIM_PAD=128))
        for res in (False, True):
            table[f"rms_norm-{dt}-{'residual' if res else 'plain'}"] = (
                rms_norm._rms_norm_kernel,
                {**{n: f"*{dt}" for n in ("out_ptr", "new_residual_ptr", "x_ptr",
                                          "residual_ptr", "weight_ptr")}, "eps": "fp32"},
                dict(HAS_RESIDUAL=res, BLOCK=4096))
        for neox, tail in ((True, 0), (False, 32)):
            table[f"rotary-{dt}-{'neox' if neox else 'gptj_partial'}"] = (
                rotary._rotary_kernel,
                {**{n: f"*{dt}" for n in ("q_out_ptr", "k_out_ptr", "q_ptr", "k_ptr")},
                 "positions_ptr": "*i64", "cos_sin_ptr": "*fp32"},
                dict(IS_NEOX=neox, HEADS_PAD=32, HALF_PAD=64, TAIL_PAD=tail))
        table[f"lora_shrink-{dt}"] = (
            lora._shrink_kernel,
            {"h_ptr": "*fp32", "x_ptr": f"*{dt}", "a_ptr": f"*{dt}", "slots_ptr": "*i64"},
            dict(BLOCK_W=64, BLOCK_K=64))
        table[f"lora_expand-{dt}"] = (
            lora._expand_kernel,
            {"out_ptr": f"*{dt}", "h_ptr": "*fp32", "b_ptr": f"*{dt}", "slots_ptr": "*i64"},
            dict(BLOCK_O=64, BLOCK_W=64))
        for qtype, name, block_bytes in ((2, "q4_0", 18), (3, "q4_1", 20), (8, "q8_0", 34)):
            table[f"gguf_linear-{name}-{dt}"] = (
                gguf_linear_triton._gguf_linear_kernel,
                {"out_ptr": f"*{dt}", "x_ptr": f"*{dt}", "w_ptr": "*u8", "bias_ptr": f"*{dt}"},
                dict(QTYPE=qtype, BLOCK_BYTES=block_bytes, HAS_BIAS=True, BLOCK_M=16,
                     BLOCK_N=gguf_linear_triton.BLOCK_N, BLOCK_K=gguf_linear_triton.BLOCK_K))
    return table


def compile_for_sm90(kernel: LazyKernel, types: dict[str, str], constants: dict[str, Any]) -> None:
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    fn = JITFunction(kernel._fn)
    signature: dict[str, str] = {}
    constexprs: dict[tuple[int, ...], Any] = {}
    for i, name in enumerate(fn.arg_names):
        if name in constants:
            signature[name] = "constexpr"
            constexprs[(i,)] = constants[name]
        else:
            signature[name] = types.get(name, "i32")
    compiled = triton_compile(ASTSource(fn, signature, constexprs),
                              target=GPUTarget("cuda", 90, 32))
    if not compiled.asm.get("cubin"):
        raise RuntimeError("no cubin produced")


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("unset TRITON_INTERPRET: this compiles for a GPU")
    results: dict[str, str] = {}
    for name, (kernel, types, constants) in variants().items():
        try:
            compile_for_sm90(kernel, types, constants)
            results[name] = "ok"
        except Exception as e:  # reported per variant, so one failure does not hide the rest
            results[name] = f"{type(e).__name__}: {e}"[-2000:]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
