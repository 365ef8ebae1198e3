"""Decode CUDA graphs: capture sizes, padding, and replay that matches the eager forward.

On CPU the graph path runs through an eager stand-in for torch.cuda.CUDAGraph (replay calls the
captured callable again, on whatever the static buffers then hold) with the Triton backend under
TRITON_INTERPRET=1: everything but the CUDA capture itself is exercised. The tests at the end
capture real graphs and need a CUDA device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from strand.engine_core.model_executor.attention.backend import AttentionBackend, AttentionMetadata
from strand.engine_core.model_executor.cuda_graphs import CapturedGraph, capture_sizes, padded_size
from strand.engine_core.model_executor.decode_graphs import DecodeGraphRunner
from strand.engine_core.model_executor.model_runner import ModelRunner
from tests.engine_core.model_executor.conftest import (
    Blocks,
    LogitsSpy,
    make_runner,
    new_req,
    prompt,
    step,
)

pytest.importorskip("triton", reason="the graph-capable attention backends run on Triton")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="captures real CUDA graphs: needs a CUDA device")


class EagerGraphs:
    """Stand-in capturer: a 'graph' re-runs its callable at replay and writes the result into
    the output it returned at capture, as a replayed CUDA graph rewrites its output."""

    def __init__(self) -> None:
        self.captured: list[int] = []  # batch size of each capture, in order
        self.replayed: list[int] = []  # batch size of each replay, in order
        self.num_pools = 0

    def new_pool(self) -> Any:
        self.num_pools += 1
        return object()

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any) -> CapturedGraph:
        output = fn().clone()
        size = output.shape[0]
        self.captured.append(size)

        def replay() -> None:
            self.replayed.append(size)
            output.copy_(fn())

        return CapturedGraph(output=output, replay=replay)


def graph_runner(model_dir: Path, **kw: Any) -> tuple[ModelRunner, EagerGraphs]:
    graphs = EagerGraphs()
    kw.setdefault("attention_backend", "triton")
    return make_runner(model_dir, graph_capturer=graphs, **kw), graphs


class Session:
    """Drives a runner as the scheduler would: prefill requests, then decode some of them."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.blocks = Blocks(runner.block_size)
        self.num_tokens: dict[str, int] = {}  # known tokens (prompt + sampled) per request

    def prefill(self, prompts: dict[str, list[int]], block_ids: dict[str, list[int]] | None = None,
                finished: tuple[str, ...] = ()) -> list[list[int]]:
        given = block_ids or {}
        reqs = [new_req(r, p, given.get(r) or self.blocks.take(0, len(p))) for r, p in
                prompts.items()]
        out = self.runner.execute_model(step(new=reqs, finished=finished,
                                             num_scheduled={r: len(p) for r, p in prompts.items()}))
        for r, p in prompts.items():
            self.num_tokens[r] = len(p) + 1
        return out.sampled_token_ids

    def decode(self, req_ids: list[str]) -> list[list[int]]:
        cached = []
        for r in req_ids:
            n = self.num_tokens[r]  # the last sampled token is computed now: seq_len n
            cached.append((r, self.blocks.take(n - 1, n), n - 1))
        num_scheduled = dict.fromkeys(req_ids, 1)
        out = self.runner.execute_model(step(cached=cached, num_scheduled=num_scheduled))
        for r in req_ids:
            self.num_tokens[r] += 1
        return out.sampled_token_ids

    def last_decode_slots(self, req_ids: list[str]) -> list[int]:
        """Cache slots the last decode of these requests wrote."""
        bs = self.runner.block_size
        slots = []
        for r in req_ids:
            pos = self.num_tokens[r] - 2  # the token before the one that decode sampled
            slots.append(self.runner.requests[r].block_ids[pos // bs] * bs + pos % bs)
        return slots


def prompts_of(num_reqs: int) -> dict[str, list[int]]:
    # Different lengths: contexts differ per row and cross block boundaries at different steps.
    return {f"r{i}": prompt(i, 5 + i) for i in range(num_reqs)}


# ---- capture sizes and padding -----------------------------------------------------------------

@pytest.mark.parametrize(("max_num_seqs", "sizes"), [
    (1, [1]),
    (2, [1, 2]),
    (3, [1, 2, 3]),
    (8, [1, 2, 4, 8]),
    (20, [1, 2, 4, 8, 16, 20]),
    (256, [1, 2, 4, 8, 16, 32, 64, 128, 256]),
])
def test_capture_sizes_are_powers_of_two_then_max_num_seqs(max_num_seqs: int,
                                                           sizes: list[int]) -> None:
    assert capture_sizes(max_num_seqs) == sizes


def test_capture_sizes_need_at_least_one_sequence() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        capture_sizes(0)


@pytest.mark.parametrize(("num_reqs", "size"), [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8),
                                                (17, 20), (20, 20), (21, None)])
def test_a_batch_is_padded_to_the_next_capture_size(num_reqs: int, size: int | None) -> None:
    assert padded_size(capture_sizes(20), num_reqs) == size


# ---- capture ----------------------------------------------------------------------------------

class RecordingModel:
    """A forward that records the batch it saw and returns [num_tokens, 2] of its inputs."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int]]] = []  # (rows, slot mapping)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                 backend: AttentionBackend) -> torch.Tensor:
        self.calls.append((input_ids.shape[0], metadata.slot_mapping.tolist()))
        return torch.stack([input_ids, positions], dim=1).float()


class UnusedBackend(AttentionBackend):
    name = "unused"
    supports_cuda_graphs = True

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata,
                scale: float, sliding_window: int | None = None,
                logit_softcap: float | None = None) -> torch.Tensor:
        raise AssertionError("RecordingModel never attends")


def recording_graph_runner(max_num_seqs: int) -> tuple[DecodeGraphRunner, RecordingModel,
                                                       EagerGraphs]:
    model, graphs = RecordingModel(), EagerGraphs()
    runner = DecodeGraphRunner(model, UnusedBackend(), [], graphs,
                               max_num_seqs=max_num_seqs, max_model_len=32, block_size=4,
                               device=torch.device("cpu"))
    return runner, model, graphs


def test_graphs_are_captured_largest_first_each_after_a_warm_up_in_one_pool() -> None:
    runner, model, graphs = recording_graph_runner(max_num_seqs=6)
    runner.capture()
    assert graphs.captured == [6, 4, 2, 1]
    assert graphs.num_pools == 1
    # Each size: one warm-up forward, then the one the capture records.
    assert [rows for rows, _ in model.calls] == [6, 6, 4, 4, 2, 2, 1, 1]
    # Nothing is loaded yet: every row is padding and writes no KV.
    assert all(slots == [-1] * rows for rows, slots in model.calls)


def test_capture_is_logged_with_its_sizes_and_time(caplog: pytest.LogCaptureFixture) -> None:
    runner, _, _ = recording_graph_runner(max_num_seqs=4)
    with caplog.at_level(logging.INFO, logger="strand.engine_core.model_executor.decode_graphs"):
        runner.capture()
    assert any("decode batch sizes [1, 2, 4]" in r.getMessage() and " s" in r.getMessage()
               for r in caplog.records)


def test_load_pads_every_row_up_to_the_graph_size() -> None:
    runner, model, _ = recording_graph_runner(max_num_seqs=8)
    runner.capture()
    # A batch of 5 first, then one of 3 in the same graph: rows 3 and 4 must not stay stale.
    runner.load(8, np.arange(5), np.arange(5), np.array([40, 41, 42, 43, 44]),
                np.array([9, 9, 9, 9, 9]), np.full((5, 9), 7, dtype=np.int32))
    ids, _, metadata = runner.load(8, np.array([5, 6, 7]), np.array([4, 5, 6]),
                                   np.array([10, 11, 12]), np.array([5, 6, 7]),
                                   np.full((3, 9), 3, dtype=np.int32))
    assert ids.tolist() == [5, 6, 7, 0, 0, 0, 0, 0]
    assert metadata.slot_mapping.tolist() == [10, 11, 12, -1, -1, -1, -1, -1]
    assert metadata.seq_lens.tolist() == [5, 6, 7, 1, 1, 1, 1, 1]
    assert metadata.seq_lens_cpu.tolist() == [5, 6, 7, 1, 1, 1, 1, 1]
    assert metadata.query_start_loc.tolist() == list(range(9))
    # Padding rows read block 0, the reserved block no request owns.
    assert bool(metadata.block_table[3:].eq(0).all())
    assert bool(metadata.block_table[:3].eq(3).all())
    assert (metadata.num_reqs, metadata.max_query_len, metadata.max_seq_len) == (8, 1, 32)
    with torch.inference_mode():  # as in execute_model
        out = runner.replay(8)
    assert out[:3, 0].tolist() == [5, 6, 7]


# ---- the runner: which steps use graphs, and what they compute ------------------------------

@pytest.mark.parametrize("max_model_len", [256, 2048], ids=["one_pass", "split_kv"])
@pytest.mark.parametrize("num_reqs", [3, 5])
def test_decode_through_graphs_gives_the_eager_forwards_tokens_and_logits(
        llama_dir: Path, num_reqs: int, max_model_len: int) -> None:
    # max_model_len 2048: the graphs' static max_seq_len makes the Triton kernel split the
    # context in 4, while the real contexts fit in one tile: empty splits must weigh nothing.
    graph, graphs = graph_runner(llama_dir, max_model_len=max_model_len)
    eager = make_runner(llama_dir, attention_backend="triton", max_model_len=max_model_len,
                        enforce_eager=True)  # on a GPU it would capture real graphs
    assert eager.decode_graphs is None
    spies = LogitsSpy(graph), LogitsSpy(eager)
    sessions = Session(graph), Session(eager)
    prompts = prompts_of(num_reqs)
    assert sessions[0].prefill(prompts) == sessions[1].prefill(prompts)
    for _ in range(6):
        tokens = [s.decode(list(prompts)) for s in sessions]
        assert tokens[0] == tokens[1]
        torch.testing.assert_close(spies[0].last, spies[1].last, rtol=1e-5, atol=1e-5)
    expected_size = 4 if num_reqs == 3 else 8
    assert graphs.replayed == [expected_size] * 6


def test_padding_rows_never_write_into_a_real_requests_blocks(llama_dir: Path) -> None:
    runner, graphs = graph_runner(llama_dir)
    session = Session(runner)
    prompts = prompts_of(5)
    session.prefill(prompts)
    session.decode(list(prompts))  # 5 rows in the size-8 graph
    # r3 and r4 finish; r5 gets r3's blocks, so r3's last slot now holds r5's prompt.
    r3_blocks = list(runner.requests["r3"].block_ids)
    session.prefill({"r5": prompt(50, session.num_tokens["r3"] + 1)}, {"r5": r3_blocks},
                    finished=("r3", "r4"))
    before = [cache.clone() for cache in runner.kv_caches]
    decoding = ["r0", "r1", "r5"]
    session.decode(decoding)  # 3 rows padded to 4: row 3 held r3 in the size-8 graph's step
    assert graphs.replayed == [8, 4]
    written = set(session.last_decode_slots(decoding))
    for old, new in zip(before, runner.kv_caches, strict=True):
        changed = (old != new).flatten(3).any(-1).any(0).flatten()  # [num_slots]
        assert set(changed.nonzero().flatten().tolist()) == written
        # Padding rows read the reserved block 0 but never write it, not even at capture.
        assert bool(new[:, 0].eq(0).all())


def test_mixed_prefill_and_decode_step_runs_eagerly(llama_dir: Path) -> None:
    runner, graphs = graph_runner(llama_dir)
    session = Session(runner)
    session.prefill(prompts_of(2))
    n = session.num_tokens["r0"]
    out = runner.execute_model(step(
        new=[new_req("c", prompt(9, 6), session.blocks.take(0, 6))],
        cached=[("r0", session.blocks.take(n - 1, n), n - 1)], num_scheduled={"r0": 1, "c": 6}))
    assert graphs.replayed == []
    assert all(len(t) == 1 for t in out.sampled_token_ids)


def test_batch_larger_than_the_largest_capture_size_runs_eagerly(llama_dir: Path) -> None:
    runner, graphs = graph_runner(llama_dir, max_num_seqs=4)
    assert graphs.captured == [4, 2, 1]
    session = Session(runner)
    prompts = prompts_of(5)  # the runner grows past max_num_seqs rows when asked to
    session.prefill(prompts)
    tokens = session.decode(list(prompts))
    assert graphs.replayed == [] and all(len(t) == 1 for t in tokens)
    session.decode(list(prompts)[:4])
    assert graphs.replayed == [4]


def test_enforce_eager_captures_no_graph(llama_dir: Path) -> None:
    runner, graphs = graph_runner(llama_dir, enforce_eager=True)
    assert runner.decode_graphs is None and graphs.captured == []
    session = Session(runner)
    session.prefill(prompts_of(3))
    session.decode(list(prompts_of(3)))
    assert graphs.replayed == []


def test_backend_that_cannot_be_replayed_from_a_graph_runs_eagerly(llama_dir: Path) -> None:
    runner, graphs = graph_runner(llama_dir, attention_backend="torch")
    assert runner.decode_graphs is None and graphs.captured == []


def test_cpu_without_an_injected_capturer_never_uses_graphs(llama_dir: Path) -> None:
    runner = make_runner(llama_dir, attention_backend="triton", device="cpu")
    assert runner.decode_graphs is None


# ---- real CUDA graphs -------------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("num_reqs", [3, 5])
def test_cuda_graphs_give_the_greedy_tokens_of_enforce_eager(llama_dir: Path,
                                                             num_reqs: int) -> None:
    graph = make_runner(llama_dir, device="cuda", attention_backend="triton")
    eager = make_runner(llama_dir, device="cuda", attention_backend="triton", enforce_eager=True)
    assert graph.decode_graphs is not None and eager.decode_graphs is None
    assert sorted(graph.decode_graphs.graphs) == [1, 2, 4, 8]
    replays: list[int] = []
    inner = graph.decode_graphs.replay

    def spy(size: int) -> torch.Tensor:
        replays.append(size)
        return inner(size)

    graph.decode_graphs.replay = spy  # type: ignore[method-assign]
    sessions = Session(graph), Session(eager)
    prompts = prompts_of(num_reqs)
    assert sessions[0].prefill(prompts) == sessions[1].prefill(prompts)
    for _ in range(8):
        assert sessions[0].decode(list(prompts)) == sessions[1].decode(list(prompts))
    assert replays == [4 if num_reqs == 3 else 8] * 8


@needs_cuda
def test_cuda_graph_padding_rows_never_write_into_a_real_requests_blocks(
        llama_dir: Path) -> None:
    runner = make_runner(llama_dir, device="cuda", attention_backend="triton")
    session = Session(runner)
    prompts = prompts_of(3)
    session.prefill(prompts)
    before = [cache.clone() for cache in runner.kv_caches]
    session.decode(list(prompts))
    written = set(session.last_decode_slots(list(prompts)))
    for old, new in zip(before, runner.kv_caches, strict=True):
        changed = (old != new).flatten(3).any(-1).any(0).flatten()
        assert set(changed.nonzero().flatten().tolist()) == written
        assert bool(new[:, 0].eq(0).all())
