"""The processing stage runs in its own service: it must not pull in torch or grpc."""

from __future__ import annotations

import subprocess
import sys


def test_processing_modules_import_without_torch_or_grpc() -> None:
    code = (
        "import sys\n"
        "import engine_core.processing.input_processor, engine_core.processing.output_processor\n"
        "import engine_core.processing.tiny_tokenizer\n"
        "print(sorted(m for m in ('torch', 'grpc', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
