"""CPU lists parse as Linux writes them, bad ones are refused by name, and pinning moves every
thread of a real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.cpu_pinning import parse_cpu_list, pin_process, split_cpus


def test_cpu_lists_parse_single_cpus_and_ranges() -> None:
    assert parse_cpu_list("0") == {0}
    assert parse_cpu_list("0,2") == {0, 2}
    assert parse_cpu_list("0-3,6") == {0, 1, 2, 3, 6}


@pytest.mark.parametrize(("text", "message"), [
    ("a", "'a' is not a CPU number or range"),
    ("0-", "'0-' is not a CPU number or range"),
    ("-1", "'-1' is not a CPU number or range"),
    ("3-1", "range '3-1' runs backwards"),
])
def test_bad_cpu_lists_are_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cpu_list(text)


def test_the_engine_needs_cpus_this_process_has_and_leaves_some_for_the_rest() -> None:
    available = os.sched_getaffinity(0)
    with pytest.raises(ValueError, match="not among this process's CPUs"):
        split_cpus({max(available) + 1})
    with pytest.raises(ValueError, match="leaves no CPU for the other stages"):
        split_cpus(set(available))
    if len(available) >= 2:
        engine, rest = split_cpus({min(available)})
        assert engine == {min(available)} and rest == available - {min(available)}


def test_pinning_moves_every_thread_of_a_process() -> None:
    # A child with a second thread: both must land on the one CPU.
    code = ("import threading, time; t = threading.Thread(target=time.sleep, args=(30,)); "
            "t.start(); print('ready', flush=True); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        cpu = min(os.sched_getaffinity(0))
        pin_process(child.pid, {cpu})
        tids = os.listdir(f"/proc/{child.pid}/task")
        assert len(tids) == 2
        assert all(os.sched_getaffinity(int(tid)) == {cpu} for tid in tids)
    finally:
        child.kill()
        child.wait(timeout=10)
