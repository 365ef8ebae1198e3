"""The real SmolLM2-135M-Instruct GGUF as an embedding model: Strand's LAST and MEAN embeddings
equal HF transformers' LlamaModel loading the same file with gguf_file= (dequantized to float32
the same way)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from strand.engine_core import LLM

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

TEXTS = ["The capital of France is Paris.", "def fibonacci(n):\n    return n",
         "A robot may not injure a human being or, through inaction, allow a human being to "
         "come to harm."]


def test_real_model_embeddings_equal_hf(smollm2_gguf: Path) -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                      dtype=torch.float32).eval()
    for kind in ("LAST", "MEAN"):
        # 16-token chunks: the longer prompts take several steps.
        llm = LLM(str(smollm2_gguf), runner="pooling", dtype="float32",
                  pooler_config={"pooling_type": kind}, max_num_batched_tokens=16)
        for out in llm.embed(TEXTS, use_tqdm=False):
            with torch.inference_mode():
                hidden = model(torch.tensor([out.prompt_token_ids])).last_hidden_state[0]
            pooled = hidden[-1] if kind == "LAST" else hidden.mean(dim=0)
            want = torch.nn.functional.normalize(pooled, dim=-1)
            got = torch.tensor(out.outputs.embedding)
            assert got.shape == (576,)
            # Measured on an AVX2 CPU: at most 5.2e-7 apart (float32 sums in another order).
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
