"""The processing stage runs in its own service: it must not pull in torch or grpc."""

from __future__ import annotations

import subprocess
import sys


def test_processing_modules_import_without_torch_or_grpc() -> None:
    code = (
        "import sys\n"
        "import strand.engine_core.processing.input_processor, strand.engine_core.processing.output_processor\n"
        "import strand.testing.tiny_tokenizer\n"
        "print(sorted(m for m in ('torch', 'grpc', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_structured_output_request_is_processed_without_torch(tmp_path) -> None:
    # The tokenizer stage checks a constraint's shape only; compiling it (xgrammar, which imports
    # torch) is the engine's job.
    code = (
        "import sys\n"
        "from strand.testing.tiny_tokenizer import write_tiny_tokenizer\n"
        "from strand.engine_core.processing.tokenizer import Tokenizer\n"
        "from strand.engine_core.processing.input_processor import InputProcessor\n"
        "from strand.engine_core.sampling_params import SamplingParams\n"
        f"write_tiny_tokenizer({str(tmp_path)!r}, 300)\n"
        f"tok = Tokenizer.from_dir({str(tmp_path)!r})\n"
        "params = SamplingParams(structured_outputs={'json': {'type': 'object'}})\n"
        "InputProcessor(tok, 64, 300).process('r', 'hi', params)\n"
        "print(sorted(m for m in ('torch', 'grpc', 'xgrammar') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
