"""torchrun itself launches a tensor-parallel engine: one process per rank running the same
script; rank 0 is the engine (group at torchrun's store, env://), the others its workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from strand.engine_core.distributed.driver import free_port
from tests.engine_core.distributed.torchrun_generate import generate
from tests.engine_core.engine.conftest import make_engine

SCRIPT = Path(__file__).with_name("torchrun_generate.py")


def test_torchrun_two_ranks_give_the_single_rank_tokens(tiny_model_dir: Path,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "tokens.json"
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port("127.0.0.1")), str(SCRIPT), str(tiny_model_dir),
           str(out), "2"]
    subprocess.run(cmd, env=env, check=True, timeout=180)
    expected = generate(make_engine(tiny_model_dir, num_gpu_blocks_override=32))
    assert json.loads(out.read_text(encoding="utf-8")) == expected
    assert sorted(expected) == ["0", "1"]
