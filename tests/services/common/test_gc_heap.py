"""freeze_startup_heap: what is alive at startup leaves the collector's passes; what is made
afterwards is still collected; at exit the heap is unfrozen for the last collection."""

from __future__ import annotations

import gc
import importlib.util
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest

from strand.services.common.gc_heap import freeze_startup_heap


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the test process's heap goes back to normal collection


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def _cycle() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


def test_the_live_heap_is_frozen_and_startup_garbage_collected_first() -> None:
    kept = _cycle()
    garbage = weakref.ref(_cycle())  # a dead cycle: only the collector frees it
    frozen = freeze_startup_heap("test")
    assert frozen == gc.get_freeze_count() > 0
    assert garbage() is None  # collected before the freeze, not kept forever
    # Alive, but in none of the three generations a collection walks.
    assert all(o is not kept for o in gc.get_objects())
    assert kept.other is not None and kept.other.other is kept


def test_cycles_made_after_the_freeze_are_still_collected() -> None:
    freeze_startup_heap("test")
    before = gc.get_freeze_count()
    later = _cycle()
    del later
    assert gc.collect() >= 2  # the new cycle's two nodes (and their dicts)
    # Nothing made after the freeze joins the frozen set. The count may fall: a frozen object
    # whose last reference goes (another thread of the test process may drop one) is freed.
    assert gc.get_freeze_count() <= before


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_a_frozen_stage_exits_without_bindings_reporting_leaks() -> None:
    # triton's nanobind module checks at exit that its objects were freed; frozen, they were not
    # collected, and every stage's stop printed a screen of "leaked function" lines.
    code = ("import torch, triton.language\n"
            "from strand.services.common.gc_heap import freeze_startup_heap\n"
            "freeze_startup_heap('test')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True)
    assert "leaked" not in result.stderr, result.stderr[-1000:]
