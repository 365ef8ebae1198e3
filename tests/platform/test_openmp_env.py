"""`import strand.engine_core` shortens libgomp's spin before torch loads it, unless the user chose a
wait policy (openmp_env.py says why)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import os, sys, strand.engine_core; "
         "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)")


def _probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, check=True,
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


def test_the_short_spin_is_set_before_torch_is_loaded() -> None:
    from strand.platform.openmp_env import SPIN_COUNT
    # torch not yet imported: libgomp will read the setting when it loads.
    assert _probe() == f"{SPIN_COUNT} False"


@pytest.mark.parametrize(("env", "expected"), [
    ({"GOMP_SPINCOUNT": "7"}, "7 False"),
    ({"OMP_WAIT_POLICY": "active"}, "None False"),
])
def test_a_users_choice_is_kept(env: dict[str, str], expected: str) -> None:
    assert _probe(**env) == expected
