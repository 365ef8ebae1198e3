#!/usr/bin/env bash
# Run the CUDA half of Strand on a lent GPU machine (the device tool's `run`), one phase per
# argument, logs under $OUT. A full check takes a few calls, such as:
#
#   bash scripts/gpu_check.sh env deps build tests kernelbench decode:qwen2.5-0.5b
#   bash scripts/gpu_check.sh deps build decode:llama-3.2-1b profile:llama-3.2-1b
#   OFFLINE_TIMEOUT=115 bash scripts/gpu_check.sh deps offline:strand offline:hf-continuous \
#       offline:hf-static prefill:llama-3.2-1b
#   FAILING="tests/..." bash scripts/gpu_check.sh deps build failing crash
#
# The machine has no network: the packages its image lacks travel as wheels in .whl/ (git-ignored,
# named in the run's carry), made here by scripts/gpu_wheels.sh.
#
# env            the card, the driver, Python/torch/Triton versions, the compilers
# deps           install the wheels carried in .whl/ into /tmp/site
# build          the CPU kernels once, before parallel test workers would each ask for them
# tests          the in-process suites with CUDA visible (kernels, model runner, engine, ...)
# services       the services, e2e, distributed and benchmark tests, one process: each engine
#                process they start sizes its cache at 0.9 of the card, so two cannot run at once
# failing        the files named in $FAILING again
# crash          a test that kills its worker, under faulthandler and cuda-gdb
# kernelbench    Triton paged attention vs torch SDPA
# decode:PRESET  decode sweep of a bf16 random-weight model, CUDA graphs on, then eager
# profile:PRESET where a decode step's time goes (host parts, GPU kernel time), batch 1 and 64
# prefill:PRESET prefill against the measured GEMM rate
# offline:BACKEND  nano-vllm's workload shape for one backend (strand, hf-continuous, hf-static)
#
# Each phase runs under its own time limit, so one that hangs cannot eat the others.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONPATH="$PWD:/tmp/site"

phase() { echo; echo "===== $1 ($(date -u +%H:%M:%S))"; }

for what in "$@"; do
  case "$what" in
    env)
      phase env
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
      python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__,
torch.version.cuda, "triton", triton.__version__, torch.cuda.get_device_name(0))'
      python3 -c 'import importlib.util as u; print("flash_attn:", u.find_spec("flash_attn") is not None)'
      g++ --version | head -1; nvcc --version | tail -1; nproc
      lscpu | grep -E "Model name|Flags" | cut -c1-200
      ;;
    deps)
      phase deps
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl 2>&1 | tail -3
      python3 -c 'import grpc, google.protobuf, opentelemetry.sdk, gguf, xgrammar, fastapi;
print("grpc", grpc.__version__, "protobuf", google.protobuf.__version__)'
      ;;
    build)
      phase "build CPU kernels"
      timeout 300 python3 -m strand.kernels.build 2>&1 | tail -5
      ;;
    tests)
      phase tests
      timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -v -p no:cacheprovider -p no:benchmark -n 8 \
        --timeout 90 --tb=short --junitxml="$OUT/tests.xml" \
        tests/kernels tests/engine_core/model_executor tests/engine_core/engine tests/engine_core/lora tests/engine_core/core tests/engine_core/conformance \
        tests/engine_core/processing tests/engine_core/structured_output tests/engine_core/connector 2>&1 | tee "$OUT/tests.log" \
        | grep -E "FAILED|ERROR|crashed|passed|failed" | tail -80
      ;;
    services)
      phase "services, e2e, distributed, benchmarks"
      timeout "${SERVICES_TIMEOUT:-560}" python3 -m pytest -q -p no:cacheprovider -p no:benchmark \
        --timeout 240 tests/services tests/e2e tests/engine_core/distributed tests/benchmarks 2>&1 \
        | tee "$OUT/services.log" | grep -E "FAILED|ERROR|passed|failed" | tail -60
      ;;
    kernelbench)
      phase "bench: Triton paged attention vs SDPA"
      timeout 120 python3 -m benchmarks.kernels 2>&1 | tee "$OUT/kernels.log" | tail -30
      ;;
    decode:*)
      preset=${what#decode:}
      phase "bench: decode $preset, CUDA graphs"
      timeout 150 python3 -m benchmarks.decode --preset "$preset" --dtype bfloat16 \
        --batch-sizes 1,8,64,256 --output-json "$OUT/decode-$preset.json" 2>&1 \
        | tee "$OUT/decode-$preset.log" | tail -14
      phase "bench: decode $preset, eager"
      timeout 100 python3 -m benchmarks.decode --preset "$preset" --dtype bfloat16 \
        --batch-sizes 1,64 --enforce-eager --output-json "$OUT/decode-$preset-eager.json" 2>&1 \
        | tee "$OUT/decode-$preset-eager.log" | tail -10
      ;;
    crash)
      # A test that kills its worker: faulthandler's Python stack, then cuda-gdb's native one.
      phase "crash: the C++ decode stack tests"
      t=tests/engine_core/model_executor/test_fused_decode.py::test_the_stack_takes_layers_of_one_size_and_a_cache_per_layer
      timeout 60 python3 -X faulthandler -m pytest -q -p no:cacheprovider "$t" > "$OUT/crash-py.log" 2>&1
      grep -A30 "Fatal Python" "$OUT/crash-py.log" | head -40
      timeout 90 cuda-gdb -q -batch -ex run -ex bt -ex "info registers rip" \
        --args python3 -m pytest -q -p no:cacheprovider "$t" 2>&1 \
        | grep -v "^\[New Thread\|^\[Thread" > "$OUT/crash-gdb.log"
      grep -E "^#([0-9]|1[0-9]) " "$OUT/crash-gdb.log" | cut -c1-220
      ;;
    failing)
      phase "the files that failed before"
      timeout 300 python3 -m pytest -v -p no:cacheprovider -p no:benchmark -n 8 --timeout 90 \
        --tb=short $FAILING 2>&1 | tee "$OUT/failing.log" | grep -E "FAILED|ERROR|crashed|passed|failed" | tail -40
      ;;
    offline:*)
      backend=${what#offline:}
      phase "offline: nano-vllm workload, $backend"
      timeout "${OFFLINE_TIMEOUT:-240}" python3 -m benchmarks.offline --preset qwen2.5-0.5b \
        --dtype bfloat16 --num-prompts 256 --input-len 562 --range-ratio 0.822 --output-len 562 \
        --output-range-ratio 0.822 --backends "$backend" --hf-batch-size 256 \
        2>&1 | tee "$OUT/offline-$backend.log" | tail -12
      ;;
    prefill:*)
      preset=${what#prefill:}
      phase "bench: prefill $preset, bf16, against the measured GEMM rate"
      for shape in "1 2048" "4 2048" "16 512"; do
        set -- $shape
        timeout 120 python3 -m benchmarks.gpu_prefill --preset "$preset" --dtype bfloat16 \
          --num-prompts $1 --prompt-len $2 2>&1 | tee -a "$OUT/prefill-$preset.log" | tail -3
      done
      ;;
    profile:*)
      preset=${what#profile:}
      phase "profile: one decode step of $preset, bf16"
      for bs in 1 64; do
        timeout 150 python3 -m benchmarks.gpu_step_profile --preset "$preset" --dtype bfloat16 \
          --batch-size $bs 2>&1 | grep -v "^USDT" | tee -a "$OUT/profile-$preset.log" | tail -34
      done
      ;;
    *) echo "unknown phase $what"; exit 2 ;;
  esac
done
