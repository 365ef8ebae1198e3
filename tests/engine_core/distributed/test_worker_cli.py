"""`strand worker` refuses flags that cannot describe a non-head node, naming the field, before
it starts any rank."""

from __future__ import annotations

import pytest

from strand.services.worker_cli import main

BASE = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
        "--master-port", "29999"]


@pytest.mark.parametrize(("flags", "field"), [
    (["--node-rank", "0"], "node_rank must be >= 1"),
    (["--node-rank", "2"], "node_rank must be in"),
    (["--node-rank", "1", "--tensor-parallel-size", "3"], "nnodes must be >= 1 and divide"),
    (["--node-rank", "1", "--master-port", "70000"], "master_port must be in"),
    (["--node-rank", "1", "--distributed-timeout-s", "0"], "distributed_timeout_s must be > 0"),
])
def test_bad_worker_flags_raise_naming_the_field(flags: list[str], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        main([*BASE, *flags])
