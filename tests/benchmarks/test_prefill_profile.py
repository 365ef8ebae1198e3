"""benchmarks/prefill_profile.py: exclusive per-part CPU time, and the parts of a real step."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import prefill_profile
from benchmarks.prefill_profile import PARTS, PartTimer


def test_a_part_excludes_the_parts_timed_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(100))  # a clock that moves 1 s per reading
    monkeypatch.setattr(prefill_profile.time, "thread_time", lambda: float(next(ticks)))
    timer = PartTimer()
    with timer.part("outer"):  # reads 0 ... 7
        with timer.part("inner"):  # reads 1, 2
            pass
        with timer.part("inner"):  # reads 3 ... 6
            with timer.part("deepest"):  # reads 4, 5
                pass
    # inner: 1 + (3 - 1); outer: 7 less the 4 its inner parts took.
    assert timer.reset() == {"deepest": 1.0, "inner": 3.0, "outer": 3.0}
    assert timer.reset() == {}  # reset hands the totals over and starts again


def test_wrap_names_each_call_by_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(100))
    monkeypatch.setattr(prefill_profile.time, "thread_time", lambda: float(next(ticks)))
    timer = PartTimer()
    double = timer.wrap(lambda x: 2 * x, lambda x: "big" if x > 1 else "small")
    assert (double(1), double(5), double(7)) == (2, 10, 14)
    assert timer.reset() == {"small": 1.0, "big": 2.0}


def test_a_tiny_models_prefill_step_is_split_into_the_parts(tiny_model_dir: Path) -> None:
    args = argparse.Namespace(hf_dir=str(tiny_model_dir), dtype="float32", tokens=24,
                              threads=1, repeats=1)
    ms = prefill_profile.profile(args)
    assert list(ms) == ["step", *PARTS, "python and the rest", "wall"]
    # Every part ran (the tiny Llama has each of them), and they add up to the step.
    assert all(ms[part] > 0 for part in PARTS)
    assert ms["step"] == pytest.approx(sum(ms[p] for p in (*PARTS, "python and the rest")))


def test_the_layers_are_unwrapped_after_the_profile(tiny_model_dir: Path) -> None:
    from strand.engine_core.model_executor.layers.linear import Linear
    from strand.engine_core.model_executor.models import llama

    before = (Linear.forward, llama.act_and_mul)
    prefill_profile.profile(argparse.Namespace(hf_dir=str(tiny_model_dir), dtype="float32",
                                               tokens=8, threads=1, repeats=1))
    assert (Linear.forward, llama.act_and_mul) == before
