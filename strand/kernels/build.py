"""`python -m strand.kernels.build`: build the CPU kernels now (a Docker image's build step, or a warm-up
before the first start); prints where they are, and exits 1 with the reason if they cannot be."""

from __future__ import annotations

import sys

from strand.kernels._cpu_build import build_dir, ensure_built, extension_name
from strand.platform.cpu_isa import probe


def main() -> int:
    print(probe().describe(), flush=True)
    reason = ensure_built(lambda line: print(line, flush=True))
    if reason is not None:
        print(f"strand: the CPU kernels could not be built: {reason}", file=sys.stderr)
        return 1
    print(f"CPU kernels ready: {build_dir() / extension_name()}.so", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
