"""GGUF model files (llama.cpp's format), loaded by converting them once into the HF directory
layout the engine reads: config.json from the metadata, model.safetensors from the tensors
(quantized ones dequantized to float32: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K and the
rest that the `gguf` package's dequantize knows), tokenizer.json rebuilt from the vocabulary, and
tokenizer_config.json with the chat template. The result is cached beside the other Strand
downloads (STRAND_CACHE_DIR, default ~/.cache/strand/gguf/), keyed by the file's path, size and
modification time: a second start reads it straight away.

This is the conversion transformers does for `from_pretrained(..., gguf_file=...)`, the oracle the
tests compare against: same dequantization, same Q/K un-permutation, same tokenizer.
"""

from engine_core.model_executor.gguf.convert import gguf_to_hf_dir, is_gguf

__all__ = ["gguf_to_hf_dir", "is_gguf"]
