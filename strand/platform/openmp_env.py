"""How long torch's OpenMP threads spin before they sleep, set before torch loads libgomp.

A thread that reaches the end of a parallel region first waits for the others. libgomp's default
is to spin for 300,000 iterations (about a millisecond) before sleeping. On a machine with no
core to spare (2 cores and a 2-thread engine, the services of a stack, other tenants) the thread
it waits for is often descheduled, and the spinning one burns the core that thread needs: on a
loaded 2-core machine the engine's output rate was several times higher with a short spin than
with the default. A short spin
keeps back-to-back regions (a decode step runs hundreds) handing off without a sleep.

Only the defaults change: a GOMP_SPINCOUNT or OMP_WAIT_POLICY the user set is kept. It must run
before torch is first imported (libgomp reads the environment once, when it is loaded); the
engine's entry points and `import strand.engine_core` call it, and it says so when torch came first.
"""

from __future__ import annotations

import logging
import os
import sys

from strand import envs

logger = logging.getLogger(__name__)

# Iterations a waiting OpenMP thread spins before it sleeps (libgomp's default: 300000).
SPIN_COUNT = 10000


def configure_openmp_wait() -> bool:
    """Set the short spin unless the user chose a wait policy; True when it takes effect."""
    if envs.user_omp_wait():
        return False
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    if "torch" in sys.modules:
        logger.debug("torch was imported before engine_core: its OpenMP threads keep "
                     "libgomp's default spin (set GOMP_SPINCOUNT=%d to change it)", SPIN_COUNT)
        return False
    return True
