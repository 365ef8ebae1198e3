"""Benchmarks: Strand side by side with its peers (see README.md here)."""

from strand.platform.openmp_env import configure_openmp_wait

# Strand measured in process as it runs as a stage: with the OpenMP wait its engine sets up
# (strand/platform/openmp_env.py); torch's peers in the same process get the same.
configure_openmp_wait()
