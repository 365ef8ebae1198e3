"""Stages of the sampler, each a pure function over batched tensors."""
