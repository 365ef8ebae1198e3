"""Triton kernels, each beside a pure-torch reference (`*_ref.py`).

paged_attention / kv_write / rms_norm / rotary need triton at launch (a CUDA device, or
TRITON_INTERPRET=1 on CPU); `_triton.available_backends()` says which attention backends can run.
"""
