"""benchmarks/router_ring.py refuses a bad workload before it starts any stack (a real run
starts three 2-replica stacks)."""

from __future__ import annotations

import pytest

from benchmarks.router_ring import main


@pytest.mark.parametrize(("argv", "message"), [
    (["--policies", "kv-aware,fastest"], "policies must be among"),
    (["--num-blocks", "0"], "num_blocks must be >= 1, got 0"),
    (["--num-sessions", "0"], "num_sessions must be >= 1, got 0"),
])
def test_a_bad_workload_is_refused_naming_the_field(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        main(argv)
