"""The peers: HF transformers static padded `generate` and continuous-batching `generate_batch`.

transformers is a benchmark dependency only (imported inside these functions). Both load the
same directory in the same dtype, run greedy and never stop at EOS, so every backend produces
the same number of tokens from the same token ids.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.common import BackendResult, log
from benchmarks.datasets import SampleRequest

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PAD_TOKEN_ID = 0  # the tiny tokenizer's <unk>; masked out, so its value does not matter
WARMUP_TOKENS = 4


def _quiet_transformers() -> None:
    # eos -1 draws a warning on every call, and CB's CPU memory probe an error without psutil;
    # neither matters here (the cache is sized explicitly) and both drown the progress bars.
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)


def run_hf_static(model_dir: str, requests: list[SampleRequest], dtype: str = "float32",
                  batch_size: int = 16, device: str = "cpu") -> BackendResult:
    """`model.generate` on left-padded batches of batch_size prompts, sorted by length so a batch
    wastes little padding. A batch runs to its longest output; only asked-for tokens count."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    model = _load(AutoModelForCausalLM, model_dir, dtype, device)
    order = sorted(range(len(requests)), key=lambda i: requests[i].prompt_len)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    _static_batch(model, [requests[order[0]]], WARMUP_TOKENS)  # first call allocates
    outputs: list[list[int]] = [[] for _ in requests]
    start = time.perf_counter()
    for batch in tqdm(batches, desc="hf-static", unit="batch", leave=False):
        generated = _static_batch(model, [requests[i] for i in batch],
                                  max(requests[i].output_len for i in batch))
        for i, tokens in zip(batch, generated, strict=True):
            outputs[i] = tokens[:requests[i].output_len]
    elapsed = time.perf_counter() - start
    return _result("hf-static", requests, outputs, elapsed,
                   {"batch_size": batch_size, "padding": "left", "sorted_by_length": True,
                    "attn_implementation": model.config._attn_implementation,
                    "num_batches": len(batches), "device": device})


def _load(auto_class: Any, model_dir: str, dtype: str, device: str, **kwargs: Any) -> Any:
    model = auto_class.from_pretrained(model_dir, dtype=_DTYPES[dtype], **kwargs)
    return model.to(device).eval()


def _static_batch(model: Any, batch: list[SampleRequest], max_new_tokens: int) -> list[list[int]]:
    width = max(r.prompt_len for r in batch)
    input_ids = torch.full((len(batch), width), PAD_TOKEN_ID, dtype=torch.long)  # [batch, width]
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, r in enumerate(batch):
        input_ids[row, width - r.prompt_len:] = torch.tensor(r.prompt_token_ids)
        mask[row, width - r.prompt_len:] = 1
    with torch.inference_mode():
        # min_new_tokens = max_new_tokens would mask EOS and change greedy picks; eos -1 keeps
        # the logits untouched and simply never matches (strand's ignore_eos).
        out = model.generate(input_ids=input_ids.to(model.device),
                             attention_mask=mask.to(model.device), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=-1,
                             pad_token_id=PAD_TOKEN_ID)
    return [row[width:].tolist() for row in out.cpu()]  # out: [batch, width + new]


def _page_size_kwarg(config_cls: Any, page_size: int) -> dict[str, Any]:
    """transformers 5.24 names the KV block size `page_size`; 5.17 (a GPU image's) `block_size`."""
    params = inspect.signature(config_cls).parameters
    return {"page_size" if "page_size" in params else "block_size": page_size}


def run_hf_continuous(model_dir: str, requests: list[SampleRequest], dtype: str = "float32",
                      max_batch_tokens: int = 2048, max_num_seqs: int = 256,
                      kv_cache_tokens: int | None = None, page_size: int = 16,
                      device: str = "cpu") -> BackendResult:
    """`generate_batch`'s manager (continuous batching, paged cache) with strand's limits: the
    same token budget per step, sequences per step and KV capacity. Timed from submitting the
    requests to the last result; loading and the manager's warm-up are not timed (as for strand,
    whose engine is built before its clock starts)."""
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    _quiet_transformers()
    model = _load(AutoModelForCausalLM, model_dir, dtype, device, attn_implementation="sdpa")
    max_len = max(r.prompt_len + r.output_len for r in requests)
    tokens = kv_cache_tokens or sum(r.prompt_len + r.output_len for r in requests)
    num_blocks = math.ceil(tokens / page_size) + len(requests)
    cb_config = ContinuousBatchingConfig(**_page_size_kwarg(ContinuousBatchingConfig, page_size),
                                         num_blocks=num_blocks,
                                         max_batch_tokens=max_batch_tokens,
                                         max_requests_per_batch=max_num_seqs)
    # eos -1: never matches, so every request runs to its max_new_tokens (ignore_eos).
    gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=PAD_TOKEN_ID,
                                  max_new_tokens=max(r.output_len for r in requests))
    hints = WorkloadHints(max_prompt_length=max(r.prompt_len for r in requests),
                          max_generated_length=max_len, num_requests=len(requests))
    outputs: list[list[int]] = [[] for _ in requests]
    errors = 0
    with model.continuous_batching_context_manager(
            generation_config=gen_config, continuous_batching_config=cb_config, block=True,
            timeout=30, warmup=True, workload_hints=hints) as manager:
        _cb_collect(manager, {"warmup": 0}, [requests[0].prompt_token_ids], [WARMUP_TOKENS])
        start = time.perf_counter()
        ids = {f"bench-{i}": i for i in range(len(requests))}
        for rid, i in ids.items():
            manager.add_request(requests[i].prompt_token_ids, request_id=rid,
                                max_new_tokens=requests[i].output_len, eos_token_id=-1)
        for rid, result in _cb_wait(manager, set(ids)).items():
            if result.error is not None:
                errors += 1
                log(f"hf-continuous: {rid} failed: {result.error}")
            outputs[ids[rid]] = list(result.generated_tokens)
        elapsed = time.perf_counter() - start
    result = _result("hf-continuous", requests, outputs, elapsed,
                     {"attn_implementation": "sdpa (paged cache)", "page_size": page_size,
                      "num_blocks": num_blocks, "max_batch_tokens": max_batch_tokens,
                      "max_requests_per_batch": max_num_seqs, "device": device})
    result.num_failed = max(result.num_failed, errors)
    return result


def _cb_collect(manager: Any, ids: dict[str, int], prompts: list[list[int]],
                max_new: list[int]) -> None:
    for rid, i in ids.items():
        manager.add_request(prompts[i], request_id=rid, max_new_tokens=max_new[i],
                            eos_token_id=-1)
    _cb_wait(manager, set(ids))


def _cb_wait(manager: Any, pending: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    bar = tqdm(total=len(pending), desc="hf-continuous", unit="req", leave=False,
               disable=len(pending) < 2)
    while pending:
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError(f"generate_batch's manager stopped with {len(pending)} "
                                   f"requests unfinished")
            continue
        if result.request_id in pending and result.is_finished():
            pending.discard(result.request_id)
            results[result.request_id] = result
            bar.update(1)
    bar.close()
    return results


def _result(name: str, requests: list[SampleRequest], outputs: list[list[int]], elapsed: float,
            settings: dict[str, Any]) -> BackendResult:
    short = sum(1 for r, out in zip(requests, outputs, strict=True) if len(out) != r.output_len)
    return BackendResult(
        backend=name, elapsed_s=elapsed, num_requests=len(requests), num_failed=short,
        prompt_tokens=sum(r.prompt_len for r in requests),
        output_tokens=sum(len(out) for out in outputs),
        settings={**settings, "num_threads": torch.get_num_threads()}, outputs=outputs)
