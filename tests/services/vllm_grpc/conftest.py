"""A Strand stack serving vllm.grpc.engine.VllmEngine (`strand serve --vllm-grpc-port`), the
stub smg-grpc-proto generates for it, and the in-process engine its greedy tokens must equal."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.engine_core.config import EngineArgs
from strand.engine_core.llm_engine import LLMEngine
from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services.launch import Stack, StackConfig, launch_stack

pytest.importorskip("smg_grpc_proto", reason="smg-grpc-proto (a dependency) is not installed")
from smg_grpc_proto.generated import vllm_engine_pb2_grpc  # noqa: E402

ENGINE_FLAGS = ["--max-num-seqs", "16", "--kv-cache-memory", str(64 * 1024**2)]
PROMPT_IDS = [5, 17, 42, 99, 7, 3, 250, 11]


def vllm_grpc_stack(model_dir: Path, log_dir: Path, profiler_dir: Path | None = None) -> Stack:
    """Auto-step, KV events on (SubscribeKvEvents relays them)."""
    config = StackConfig(model=str(model_dir), engine_args=[*ENGINE_FLAGS, "--kv-events"],
                         gateway_args=["--auto-step"], log_dir=log_dir, vllm_grpc_port=0)
    saved = os.environ.get("STRAND_TORCH_PROFILER_DIR")
    if profiler_dir is not None:
        os.environ["STRAND_TORCH_PROFILER_DIR"] = str(profiler_dir)
    try:
        return launch_stack(config, timeout=180)
    finally:
        if saved is None:
            os.environ.pop("STRAND_TORCH_PROFILER_DIR", None)
        else:
            os.environ["STRAND_TORCH_PROFILER_DIR"] = saved


@pytest.fixture(scope="module")
def vstack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with vllm_grpc_stack(tiny_model_dir, tmp_path_factory.mktemp("vllm-grpc-logs"),
                         tmp_path_factory.mktemp("profiles")) as stack:
        yield stack


@pytest.fixture
def stub(vstack: Stack) -> Iterator[vllm_engine_pb2_grpc.VllmEngineStub]:
    with grpc.insecure_channel(vstack.address("vllm_grpc")) as channel:
        yield vllm_engine_pb2_grpc.VllmEngineStub(channel)


def greedy_in_process(model_dir: Path, prompt: list[int] | str, max_tokens: int
                      ) -> tuple[list[int], int]:
    """The in-process engine's greedy tokens for the prompt (token ids or text), and the
    prompt's length in tokens."""
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(model_dir), max_num_seqs=16,
                                                   kv_cache_memory=64 * 1024**2))
    engine.add_request("ref", prompt if isinstance(prompt, str) else {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    tokens: list[int] = []
    num_prompt = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            if isinstance(output, RequestOutput) and output.finished:
                tokens = list(output.outputs[0].token_ids)
                num_prompt = len(output.prompt_token_ids)
    return tokens, num_prompt
