"""Every environment variable Strand reads, read here and nowhere else (as vLLM's vllm/envs.py).

One accessor per variable (or per group read together), each with what it does and its
default; docs/environment.md lists them all with the part that reads each. An accessor reads
the environment when it is called, never at import, so a value set later (a test's
monkeypatch.setenv, a launcher's child environment) is seen. tests/test_envs.py fails when
another module of strand/ reads os.environ or os.getenv, or when an accessor is missing from
docs/environment.md.

What Strand *sets* for the libraries it loads (GOMP_SPINCOUNT, THP_MEM_ALLOC_ENABLE,
GRPC_EXPERIMENTS, the ISA caps of strand/platform/cpu_isa.py, a stage's STRAND_STAGE_TOKEN) is
written where it is decided; this module only answers what is set. The C++ kernels read a few
variables themselves (std::getenv); docs/environment.md lists those too.

Stdlib only: it is imported before torch and grpc, whose libraries read the environment once,
when they load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# What torchrun (torch.distributed.run) sets in each process it starts.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                 "MASTER_PORT")
# OpenMP placement a user chose; the engine then leaves its threads where OpenMP puts them.
OMP_PLACEMENT_VARS = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")
# OpenMP waiting a user chose; Strand's short spin (strand/platform/openmp_env.py) is not set then.
OMP_WAIT_VARS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _is_set(name: str) -> bool:
    return name in os.environ


def _on(name: str) -> bool:
    """Set to anything but "" (so STRAND_X=0 turns it on too, as the C++ kernels read it)."""
    return bool(os.environ.get(name))


# --- General ---

def cache_dir() -> Path:
    """STRAND_CACHE_DIR: where pulled models, converted GGUF files and the default tiny model
    are kept. Default ~/.cache/strand."""
    return Path(os.environ.get("STRAND_CACHE_DIR") or Path.home() / ".cache" / "strand")


def log_level() -> str:
    """STRAND_LOG_LEVEL: the services' and workers' log level (DEBUG also prints tracebacks of
    user errors), upper-cased. Default "" (unset: INFO for the services, WARNING for workers)."""
    return os.environ.get("STRAND_LOG_LEVEL", "").strip().upper()


def torch_profiler_dir() -> str:
    """STRAND_TORCH_PROFILER_DIR: where start_profile/stop_profile write Chrome traces.
    Default "" (profiling refused)."""
    return os.environ.get("STRAND_TORCH_PROFILER_DIR", "")


# --- CPU: ISA, kernels, threads, memory ---

def cpu_isa() -> str:
    """STRAND_CPU_ISA: cap every CPU path at generic, avx2 or avx512 (lower-cased).
    Default "" (the CPU's own level)."""
    return os.environ.get("STRAND_CPU_ISA", "").strip().lower()


def disable_vnni() -> bool:
    """STRAND_DISABLE_VNNI (set at all): build the avx512 level without AVX-512 VNNI.
    Default off."""
    return _is_set("STRAND_DISABLE_VNNI")


def disable_amx() -> bool:
    """STRAND_DISABLE_AMX (non-empty): no AMX tiles for bfloat16 prefill attention.
    Default off."""
    return _on("STRAND_DISABLE_AMX")


def disable_avx512_bf16() -> bool:
    """STRAND_DISABLE_AVX512_BF16 (set at all): no VDPBF16PS, in Python's choices and the C++
    kernels' alike. Default off."""
    return _is_set("STRAND_DISABLE_AVX512_BF16")


def disable_cpu_kernels() -> bool:
    """STRAND_DISABLE_CPU_KERNELS (non-empty): no C++ CPU kernels and no oneDNN linear layers;
    the pure-torch paths run. Default off."""
    return _on("STRAND_DISABLE_CPU_KERNELS")


def cpu_gemm() -> str:
    """STRAND_CPU_GEMM: "onednn" lets Strand choose its CPU linear layers; anything else
    (torch) keeps torch's default matmul. Default "onednn"."""
    return os.environ.get("STRAND_CPU_GEMM", "onednn")


def linear_panels() -> bool:
    """STRAND_LINEAR_PANELS: 0 keeps float32 weights out of Strand's panel GEMM (oneDNN runs
    instead). Default on."""
    return os.environ.get("STRAND_LINEAR_PANELS") != "0"


def linear_batch() -> bool:
    """STRAND_LINEAR_BATCH: 0 keeps decode batches at the avx2 level on oneDNN instead of
    linear_batch. Default on."""
    return os.environ.get("STRAND_LINEAR_BATCH") != "0"


def huge_page_weights() -> bool:
    """STRAND_HUGE_PAGE_WEIGHTS: 0 leaves the few-row kernel's weights where they were loaded
    instead of one huge-page block. Default on."""
    return os.environ.get("STRAND_HUGE_PAGE_WEIGHTS", "1") != "0"


def keep_dense_weights() -> bool:
    """STRAND_KEEP_DENSE_WEIGHTS: 1 keeps weights' dense copy beside their panels (float32 or
    bfloat16), for the few-row kernel (A/B runs; twice the memory). Default off: the panels are
    the only copy."""
    return os.environ.get("STRAND_KEEP_DENSE_WEIGHTS", "0") == "1"


def cpu_bind() -> str:
    """STRAND_CPU_BIND: "off" never spreads the OpenMP team over CPUs after an idle gap;
    "auto" does. Default "auto"."""
    return os.environ.get("STRAND_CPU_BIND") or "auto"


def user_omp_placement() -> bool:
    """Whether the user placed OpenMP threads (OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY
    set): the engine then never binds them. Default no."""
    return any(_is_set(name) for name in OMP_PLACEMENT_VARS)


def user_omp_wait() -> bool:
    """Whether the user chose how OpenMP threads wait (GOMP_SPINCOUNT or OMP_WAIT_POLICY set):
    Strand's short spin is not set then. Default no."""
    return any(_is_set(name) for name in OMP_WAIT_VARS)


def user_thp_mem_alloc() -> bool:
    """Whether the user set THP_MEM_ALLOC_ENABLE (torch's huge pages for large CPU tensors, 0
    included): Strand then does not set it to 1. Default no."""
    return _is_set("THP_MEM_ALLOC_ENABLE")


def triton_interpret() -> bool:
    """TRITON_INTERPRET (not "" or "0"): Triton kernels run on CPU tensors in Triton's
    interpreter. Default off."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# --- Services ---

def stage_token() -> str | None:
    """STRAND_STAGE_TOKEN: the bearer token the internal stages require of their callers
    (`strand serve` makes one per stack). Default None (no token)."""
    return os.environ.get("STRAND_STAGE_TOKEN") or None


def stage_transport() -> str:
    """STRAND_STAGE_TRANSPORT: "grpc" keeps every stage edge on gRPC; "auto" takes the local
    link to stages on this host. Default "auto"."""
    return os.environ.get("STRAND_STAGE_TRANSPORT") or "auto"


def grpc_iomgr(environ: Mapping[str, str] | None = None) -> bool:
    """STRAND_GRPC_IOMGR (not "" or "0"): put gRPC on its older iomgr TCP path. Default off."""
    return _env(environ).get("STRAND_GRPC_IOMGR", "") not in ("", "0")


def user_grpc_experiments(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user set GRPC_EXPERIMENTS: STRAND_GRPC_IOMGR then changes nothing.
    Default no."""
    return "GRPC_EXPERIMENTS" in _env(environ)


def otlp_traces_endpoint() -> str | None:
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT: where spans are
    exported when no --otlp-traces-endpoint is given. Default None (no spans recorded)."""
    return (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)


def otel_service_name() -> str | None:
    """OTEL_SERVICE_NAME: the service name on exported spans. Default None (the stage's name)."""
    return os.environ.get("OTEL_SERVICE_NAME")


# --- Distributed ---

def torchrun() -> dict[str, str] | None:
    """torchrun's RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT,
    when all are set (torchrun started this process). Default None."""
    if not all(_is_set(name) for name in TORCHRUN_VARS):
        return None
    return {name: os.environ[name] for name in TORCHRUN_VARS}
