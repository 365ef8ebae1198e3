#!/usr/bin/env sh
# Fill .whl/ (git-ignored) with the wheels a lent GPU machine lacks, for its Python 3.12: it has
# torch, Triton, transformers and pytest, but no network. Run here, then name .whl in the device
# run's carry and start the command with `bash scripts/gpu_check.sh deps ...`. Versions follow
# this machine's environment, so both sides speak the same protobuf.
set -e
cd "$(dirname "$0")/.."
mkdir -p .git/info
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
version() { python -m pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}'; }
pins=""
for name in grpcio grpcio-health-checking grpcio-reflection protobuf opentelemetry-api \
    opentelemetry-sdk opentelemetry-exporter-otlp-proto-grpc \
    opentelemetry-exporter-otlp-proto-common opentelemetry-proto \
    opentelemetry-semantic-conventions googleapis-common-protos gguf fastapi starlette pydantic \
    pydantic-core annotated-types annotated-doc typing-inspection typing-extensions uvicorn \
    xgrammar apache-tvm-ffi openai jiter sniffio anyio httpx2 httpcore2 idna truststore; do
  v=$(version "$name")
  if [ -z "$v" ]; then echo "not installed here: $name (skipped)"; continue; fi
  pins="$pins $name==$v"
done
# shellcheck disable=SC2086
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pins
du -sh .whl
