"""A tiny workload for the benchmark smoke tests: fast on 2 shared cores, every code path run."""

from __future__ import annotations

from pathlib import Path

# Small enough that every backend finishes in seconds; the standard workload is the defaults.
TINY_WORKLOAD = ["--num-prompts", "4", "--input-len", "24", "--range-ratio", "0.5",
                 "--output-len", "8", "--num-threads", "1"]
TINY_BOUND = ["--gemm-size", "256", "--copy-mib", "16"]


def services_available() -> bool:
    try:
        import services.client  # noqa: F401
        import services.launch  # noqa: F401
    except ImportError:
        return False
    return True


def model_flags(model_dir: Path) -> list[str]:
    return ["--model", str(model_dir)]
