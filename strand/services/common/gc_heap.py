"""The startup heap of a stage moved out of Python's cyclic garbage collector once it serves.

A stage process holds some 300,000 GC-tracked objects after startup (torch, transformers, the
model's modules, protobuf descriptors), all alive until the process ends. Python's oldest
generation is collected every so often, and such a pass walks every one of them: in an engine
process with even a small model loaded, a stall of a tenth of a second or more for every stream
that pass lands in. Frozen (gc.freeze, as vLLM's freeze_gc_heap does after its server starts), they
are skipped, and the same pass takes a small fraction of a millisecond. Objects made later are
collected as before, so cycles built while serving are still reclaimed.
"""

from __future__ import annotations

import atexit
import gc
import logging

logger = logging.getLogger(__name__)


def freeze_startup_heap(name: str) -> int:
    """Collect, then freeze what is left (garbage frozen would never be reclaimed); returns
    the number of objects frozen. Call once, when startup is done and before traffic."""
    gc.collect()
    gc.freeze()
    # Frozen objects are skipped by the interpreter's last collection too, so bindings that
    # check for leaks at exit found them alive: triton's (nanobind) printed a screen of "leaked
    # function" lines whenever a stage stopped. Back in the collector's reach for that pass.
    atexit.unregister(gc.unfreeze)  # once, however often this is called
    atexit.register(gc.unfreeze)
    frozen = gc.get_freeze_count()
    logger.info("%s: %d startup objects frozen out of the garbage collector's passes", name,
                frozen)
    return frozen
