"""A tiny workload for the benchmark smoke tests: fast on 2 shared cores, every code path run."""

from __future__ import annotations

from pathlib import Path

import pytest

# Small enough that every backend finishes in seconds; the standard workload is the defaults.
TINY_WORKLOAD = ["--num-prompts", "4", "--input-len", "24", "--range-ratio", "0.5",
                 "--output-len", "8", "--num-threads", "1"]
TINY_BOUND = ["--gemm-size", "256", "--copy-mib", "16"]


def services_available() -> bool:
    try:
        import strand.services.client  # noqa: F401
        import strand.services.launch  # noqa: F401
    except ImportError:
        return False
    return True


def model_flags(model_dir: Path) -> list[str]:
    return ["--model", str(model_dir)]


@pytest.fixture(scope="session")
def q4_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (hidden 64, 2 layers, vocabulary 512) as a Q4_1 GGUF file."""
    pytest.importorskip("gguf")
    from tests.conftest import build_tiny_model
    from tests.engine_core.model_executor.gguf_writer import write_gguf

    root = tmp_path_factory.mktemp("bench-q")
    model_dir = build_tiny_model(root / "tiny", hidden_size=64, num_heads=4, num_kv_heads=2,
                                 intermediate_size=128)
    path = root / "tiny-Q4_1.gguf"
    write_gguf(model_dir, path, "Q4_1")
    return path
