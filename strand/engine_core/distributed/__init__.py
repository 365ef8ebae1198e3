"""Tensor parallelism on torch.distributed: docs/tensor_parallel.md."""
