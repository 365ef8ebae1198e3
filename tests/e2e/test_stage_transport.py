"""Which transport the ring's internal streams take: the local link between stages on one host
(each stage's end of a linked stream is a connected abstract Unix socket named after its port),
none of it under STRAND_STAGE_TRANSPORT=grpc, and the same outputs either way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strand.engine_core.config import EngineArgs
from strand.engine_core.llm_engine import LLMEngine
from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from strand.services.common.stage_link import TRANSPORT_ENV
from strand.services.demo import run_seed_loop
from strand.services.launch import Stack
from tests.e2e.conftest import ENGINE_FLAGS, start_stack
from tests.e2e.test_parity import _summary

_CONNECTED = "03"


def linked_streams(port: int) -> int:
    """Streams the stage on `port` serves over its link now (/proc/net/unix: the accepted,
    connected sockets that carry the link's name)."""
    name = f"@strand-stage-{port}"
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return sum(1 for row in rows if len(row) == 8 and row[7] == name and row[5] == _CONNECTED)


def test_every_internal_stream_of_a_one_host_stack_is_linked(stack: Stack,
                                                             client: EngineClient) -> None:
    client.add_request("link-1", "over the link", SamplingParams(temperature=0.0, max_tokens=2))
    while client.has_unfinished_requests():
        client.step()
    # The gateway's Session; the tokenizer's Session and the detokenizer's Outputs; the
    # tokenizer's Session and the gateway's Outputs.
    assert linked_streams(stack.ports["tokenizer"]) >= 1
    assert linked_streams(stack.ports["engine"]) >= 2
    assert linked_streams(stack.ports["detokenizer"]) >= 2


@pytest.fixture(scope="module")
def grpc_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(TRANSPORT_ENV, "grpc")  # read by every stage as it starts
        stack = start_stack(tiny_model_dir, tmp_path_factory.mktemp("grpc-transport-logs"))
    with stack:
        yield stack


@pytest.fixture(scope="module")
def in_process(tiny_model_dir: Path) -> LLMEngine:
    import torch

    torch.set_num_threads(1)
    return LLMEngine.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                 max_num_seqs=int(ENGINE_FLAGS[1]),
                                                 kv_cache_memory=int(ENGINE_FLAGS[3])))


def test_a_grpc_only_stack_links_nothing_and_reads_as_in_process(grpc_stack: Stack,
                                                                 in_process: LLMEngine) -> None:
    expected, expected_reset = run_seed_loop(in_process)
    with EngineClient(grpc_stack.gateway_address, timeout=60) as remote:
        got, got_reset = run_seed_loop(remote)
    assert _summary(got) == _summary(expected) and got_reset is expected_reset is True
    assert all(linked_streams(grpc_stack.ports[name]) == 0
               for name in ("tokenizer", "engine", "detokenizer"))
