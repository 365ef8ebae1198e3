"""Speculative decoding by prompt lookup (vLLM's "ngram" method): drafts from the request's own
tokens, verified in one forward, exact in distribution."""
