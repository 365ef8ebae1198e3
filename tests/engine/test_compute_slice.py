"""The compute threads' long scheduler slice (compute_slice.py says why)."""

from __future__ import annotations

import platform
import threading
from typing import Any

import pytest

from engine_core import compute_slice


def _kernel_has_custom_slices() -> bool:
    """Linux 6.12 and later take a slice for an ordinary thread."""
    if platform.system() != "Linux":
        return False
    release = platform.release().split(".")
    try:
        return (int(release[0]), int(release[1].split("-")[0])) >= (6, 12)
    except (IndexError, ValueError):
        return False


def _in_thread(fn: Any) -> Any:
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", fn()))
    thread.start()
    thread.join()
    return box["result"]


@pytest.mark.parametrize(("raw", "ns"), [(None, compute_slice.COMPUTE_SLICE_NS), ("", 20_000_000),
                                         ("0", 0), ("5", 5_000_000), ("0.5", 500_000)])
def test_the_slice_comes_from_the_environment(raw: str | None, ns: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if raw is None:
        monkeypatch.delenv(compute_slice.SLICE_ENV, raising=False)
    else:
        monkeypatch.setenv(compute_slice.SLICE_ENV, raw)
    assert compute_slice.slice_from_env() == ns


@pytest.mark.parametrize(("raw", "message"), [
    ("fast", "STRAND_COMPUTE_SLICE_MS must be a number of milliseconds, got 'fast'"),
    ("101", "STRAND_COMPUTE_SLICE_MS must be between 0 and 100 ms, got '101'"),
    ("-1", "STRAND_COMPUTE_SLICE_MS must be between 0 and 100 ms, got '-1'"),
])
def test_a_bad_slice_is_refused_by_name(raw: str, message: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compute_slice.SLICE_ENV, raw)
    with pytest.raises(ValueError, match=message):
        compute_slice.slice_from_env()


def test_the_slice_is_the_calling_threads_and_its_childrens() -> None:
    def body() -> tuple[bool, int | None, int | None]:
        taken = compute_slice.lengthen_compute_slice(7_000_000)
        child: dict[str, int | None] = {}
        thread = threading.Thread(target=lambda: child.setdefault(
            "ns", compute_slice.thread_slice_ns()))
        thread.start()
        thread.join()
        return taken, compute_slice.thread_slice_ns(), child["ns"]

    before = compute_slice.thread_slice_ns()
    taken, mine, inherited = _in_thread(body)
    assert compute_slice.thread_slice_ns() == before  # this thread keeps the default
    if not _kernel_has_custom_slices():
        assert not taken
        return
    assert taken and mine == inherited == 7_000_000
    assert before != 7_000_000


def test_zero_asks_for_nothing() -> None:
    assert _in_thread(lambda: (compute_slice.lengthen_compute_slice(0),
                               compute_slice.thread_slice_ns())) == (
        False, compute_slice.thread_slice_ns())


@pytest.mark.skipif(not _kernel_has_custom_slices(), reason="the kernel keeps its own slices")
def test_the_engine_stage_steps_on_a_thread_with_the_long_slice(
        tiny_model_dir: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine_core.config import EngineArgs
    from services.engine.servicer import EngineServicer

    monkeypatch.delenv(compute_slice.SLICE_ENV, raising=False)
    servicer = EngineServicer.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                          kv_cache_memory=8 * 1024**2))
    try:
        assert servicer.thread.submit(compute_slice.thread_slice_ns).result() == (
            compute_slice.COMPUTE_SLICE_NS)
        assert compute_slice.thread_slice_ns() != compute_slice.COMPUTE_SLICE_NS  # the loop's
    finally:
        servicer.close()
