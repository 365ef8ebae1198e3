"""Builders for tests, examples and the demo: tiny random models and their tokenizer."""
