"""Benchmarks: Strand side by side with its peers (see README.md here)."""
