#!/usr/bin/env sh
# Regenerate strand/services/_proto from protos/ (the same command the staleness test runs).
set -e
cd "$(dirname "$0")/.."
exec python -m strand.services.common.gen_protos "$@"
