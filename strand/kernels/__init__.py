"""Triton kernels, each beside a pure-torch reference (`*_ref.py`).

paged_attention / kv_write / rms_norm / rotary need triton at launch (a CUDA device, or
TRITON_INTERPRET=1 on CPU); `_triton.available_backends()` says which attention backends can run.
"""

from strand.platform.cpu_isa import apply_override as _apply_cpu_isa_override

# Before anything runs oneDNN or torch's vectorized kernels: they read their caps once.
_apply_cpu_isa_override()
