"""Builders for the model runner tests: tiny models, runners, hand-built SchedulerOutputs, and
HF transformers as the oracle (test time only)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core.config import CacheConfig, SchedulerConfig
from strand.engine_core.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from strand.engine_core.model_executor.cuda_graphs import GraphCapturer
from strand.engine_core.model_executor.model_config import load_model_config
from strand.engine_core.model_executor.model_runner import ModelRunner
from strand.engine_core.model_executor.models import llama_fused_decode as fused_decode
from strand.engine_core.sampling_params import SamplingParams
from strand.testing.tiny_model import LLAMA3_ROPE_SCALING, make_tiny_model

torch.set_num_threads(1)

SMALL = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "vocab_size": 512}
# name -> make_tiny_model arguments of the HF comparison variants.
VARIANTS: dict[str, dict[str, Any]] = {
    "llama": {"arch": "llama"},
    "llama3_rope_tied": {"arch": "llama", "rope_scaling": LLAMA3_ROPE_SCALING,
                         "rope_theta": 500000.0, "tie_word_embeddings": True},
    "llama_linear_rope": {"arch": "llama", "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "mistral": {"arch": "mistral", "num_shards": 2},
    "qwen2": {"arch": "qwen2", "tie_word_embeddings": True},
}


def build_model_dir(path: Path, **overrides: Any) -> Path:
    spec: dict[str, Any] = {**SMALL, "seed": 0, "with_tokenizer": False}
    spec.update(overrides)
    return make_tiny_model(path, **spec)


@pytest.fixture(scope="session")
def variant_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: build_model_dir(tmp_path_factory.mktemp(name), **spec)
            for name, spec in VARIANTS.items()}


@pytest.fixture(scope="session")
def llama_dir(variant_dirs: dict[str, Path]) -> Path:
    return variant_dirs["llama"]


def make_runner(model_dir: Path, *, num_blocks: int = 64, block_size: int = 4,
                max_model_len: int = 256, max_num_seqs: int = 8, dtype: str = "float32",
                attention_backend: str | None = None, device: str | None = None,
                enforce_eager: bool = False,
                graph_capturer: GraphCapturer | None = None) -> ModelRunner:
    if device is None:
        # Triton runs its kernels on a GPU where there is one; on a CPU through the interpreter.
        cuda = attention_backend == "triton" and torch.cuda.is_available()
        device = "cuda" if cuda else "cpu"
    config = load_model_config(str(model_dir), dtype)
    runner = ModelRunner(
        config,
        CacheConfig(block_size=block_size, num_gpu_blocks_override=num_blocks),
        SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=max_num_seqs,
                        max_model_len=max_model_len),
        device=device, attention_backend=attention_backend, enforce_eager=enforce_eager,
        graph_capturer=graph_capturer)
    runner.initialize_kv_cache(runner.determine_num_blocks())
    return runner


class Blocks:
    """Hands out distinct block ids (block 0 stays reserved, as in the real pool)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.next_id = 1

    def take(self, num_tokens_before: int, num_tokens_after: int) -> list[int]:
        """The new block ids a request needs to grow from one token count to the other."""
        have = -(-num_tokens_before // self.block_size)
        need = -(-num_tokens_after // self.block_size)
        ids = list(range(self.next_id, self.next_id + need - have))
        self.next_id += len(ids)
        return ids


def new_req(req_id: str, prompt: Sequence[int], block_ids: list[int], num_computed: int = 0,
            output: Sequence[int] = (), **params: Any) -> NewRequestData:
    params.setdefault("temperature", 0.0)
    return NewRequestData(req_id, list(prompt), list(output), SamplingParams(**params),
                          block_ids, num_computed)


def step(new: Iterable[NewRequestData] = (), cached: Iterable[tuple[str, list[int], int]] = (),
         num_scheduled: dict[str, int] | None = None, finished: Iterable[str] = (),
         preempted: Iterable[str] = ()) -> SchedulerOutput:
    """cached: (req_id, new block ids, num_computed_tokens before this step)."""
    cached = list(cached)
    data = CachedRequestData([c[0] for c in cached], [c[1] for c in cached],
                             [c[2] for c in cached])
    num_scheduled = dict(num_scheduled or {})
    return SchedulerOutput(list(new), data, num_scheduled, sum(num_scheduled.values()),
                           set(finished), set(preempted))


class LogitsSpy:
    """Wraps runner.compute_logits and keeps what each step computed."""

    def __init__(self, runner: ModelRunner) -> None:
        self.calls: list[torch.Tensor] = []
        inner = runner.compute_logits

        def spy(inputs: Any) -> torch.Tensor:
            logits = inner(inputs)
            self.calls.append(logits.detach().clone())
            return logits

        runner.compute_logits = spy  # type: ignore[method-assign]

    @property
    def last(self) -> torch.Tensor:
        return self.calls[-1]


@functools.cache
def _hf_model(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    # Eager attention: HF's reference (its SDPA path drops Gemma 2's attention soft-capping in
    # some releases; 5.17 gave 10% logit errors there, 5.24 does not).
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def hf_logits(model_dir: Path, token_ids: Sequence[int]) -> torch.Tensor:
    """[len(token_ids), vocab] float32 logits of HF transformers on the same directory."""
    with torch.inference_mode():
        out = _hf_model(str(model_dir))(torch.tensor([list(token_ids)]))
    return out.logits[0].float()


def max_rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.float().cpu() - ref).abs().max() / ref.abs().max())


def prompt(seed: int, length: int, vocab_size: int = 512) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (length,), generator=g).tolist()


def count_fused_calls(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    """Appends "forward" or "logits" to calls at each fused step (the stack's hidden states, or
    its logits where it holds the lm_head)."""
    for name in ("forward", "logits"):
        real = getattr(fused_decode, name)

        def counting(*args: Any, real: Any = real, name: str = name) -> Any:
            calls.append(name)
            return real(*args)

        monkeypatch.setattr(fused_decode, name, counting)
