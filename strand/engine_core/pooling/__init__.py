"""Embeddings (vLLM's pooling runner): a prompt in, one vector out, from the same paged forward
that generation runs."""
