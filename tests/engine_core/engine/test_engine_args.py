"""EngineArgs: vLLM's flag names on the command line, and clear errors for bad values."""

from __future__ import annotations

import argparse

import pytest

from strand.engine_core import EngineArgs


def test_cli_flags_round_trip_into_engine_args() -> None:
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(
        ["--model", "/m", "--max-num-seqs", "8", "--no-enable-prefix-caching",
         "--kv-connector-config", '{"num_cpu_blocks": 4}', "--scheduling-policy", "priority",
         "--cpu-threads", "3"]))
    assert (args.model, args.max_num_seqs, args.enable_prefix_caching) == ("/m", 8, False)
    assert args.kv_connector_config == {"num_cpu_blocks": 4}
    assert args.scheduling_policy == "priority"
    assert args.cpu_threads == 3


@pytest.mark.parametrize(("field", "kwargs"), [
    ("scheduling_policy", {"scheduling_policy": "lifo"}),
    ("dtype", {"dtype": "int8"}),
    ("device", {"device": "tpu"}),
    ("gpu_memory_utilization", {"gpu_memory_utilization": 1.5}),
    ("max_num_seqs", {"max_num_seqs": 0}),
    ("tensor_parallel_size", {"tensor_parallel_size": 0}),
    ("nnodes", {"tensor_parallel_size": 2, "nnodes": 3}),
    ("node_rank", {"tensor_parallel_size": 2, "nnodes": 2, "node_rank": 2, "master_port": 1}),
    ("master_port", {"tensor_parallel_size": 2, "nnodes": 2}),
    ("distributed_timeout_s", {"distributed_timeout_s": 0}),
    ("kv_connector", {"tensor_parallel_size": 2, "kv_connector": "multi"}),
    ("quantization", {"tensor_parallel_size": 2, "quantization": "gguf"}),
    ("cpu_threads", {"cpu_threads": 0}),
])
def test_bad_engine_args_raise_naming_the_field(field: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=field):
        EngineArgs(**kwargs)


def test_cpu_threads_sets_the_compute_pool(tiny_model_dir: object) -> None:
    import torch

    from strand.engine_core import LLMEngine

    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2  # a value that differs from what it was
    try:
        LLMEngine.from_engine_args(EngineArgs(model=str(tiny_model_dir), cpu_threads=wanted,
                                              kv_cache_memory=8 * 1024**2))
        assert torch.get_num_threads() == wanted
    finally:
        torch.set_num_threads(before)
