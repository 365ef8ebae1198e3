"""The long C++ kernel calls let go of the GIL while they compute (strand/kernels/csrc/bindings.cpp):
the engine service's event loop, on another thread of the engine's process, keeps running
during a step instead of waiting for it to end."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from strand.kernels._cpu_build import KERNELS

pytestmark = pytest.mark.skipif(KERNELS.module() is None, reason="CPU kernels not built")


def test_another_python_thread_runs_while_decode_attention_computes() -> None:
    module = KERNELS.module()
    assert module is not None
    torch.set_num_threads(1)  # the kernel on one core, the ticking thread on the other
    g = torch.Generator().manual_seed(0)
    num_reqs, blocks_per_req, block_size = 64, 32, 16
    kv = torch.randn(2, 1 + num_reqs * blocks_per_req, block_size, 4, 64, generator=g)
    table = (1 + torch.arange(num_reqs * blocks_per_req, dtype=torch.int32)).view(num_reqs, -1)
    lens = torch.full((num_reqs,), blocks_per_req * block_size, dtype=torch.int32)
    query = torch.randn(num_reqs, 8, 64, generator=g)
    out = torch.empty_like(query)
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())

    thread = threading.Thread(target=tick)
    thread.start()
    during: list[int] = []
    try:
        time.sleep(0.01)
        # The other thread must run during the calls; a kernel that held the GIL would give
        # every call no tick at all. On CI's 2 busy CPUs a call now and then gets none anyway
        # (the ticker descheduled by the OS: the first call after it started once, and a later
        # one in a run whose other two calls got 77242 and 78531), so up to 10 calls are
        # timed until 3 have seen it run.
        for _ in range(10):  # the module's own call: no Python of the wrapper around it
            start = time.perf_counter()
            module.decode_attention(out, query, kv[0], kv[1], table, lens, 0.125)
            end = time.perf_counter()
            during.append(sum(1 for t in ticks if start < t < end))
            if sum(1 for n in during if n > 0) >= 3:
                break
    finally:
        stop.set()
        thread.join()
    # Holding the GIL, every call (a few ms here) would leave the other thread no tick at all.
    assert sum(1 for n in during if n > 0) >= 3, during
