"""GGUF model files (llama.cpp's format). Their metadata is converted once into the HF directory
layout the engine reads: config.json from the metadata, tokenizer.json rebuilt from the
vocabulary, tokenizer_config.json with the chat template, and gguf_source.json naming the file.
That directory is cached beside the other Strand downloads (STRAND_CACHE_DIR, default
~/.cache/strand/gguf/), keyed by the file's path, size and modification time. The weights stay in
the file: the loader reads them from it under their HF names (weights.py), dequantizing to
float32 as it copies them (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K and the rest that the
`gguf` package's dequantize knows), or, with quantization='gguf', keeps the linear layers in their
blocks (quantized.py).

This is the conversion transformers does for `from_pretrained(..., gguf_file=...)`, the oracle the
tests compare against: same dequantization, same Q/K un-permutation, same tokenizer.
"""

from strand.engine_core.model_executor.gguf.convert import gguf_to_hf_dir, is_gguf

__all__ = ["gguf_to_hf_dir", "is_gguf"]
