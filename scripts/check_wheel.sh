#!/usr/bin/env bash
# Build a wheel of Strand and install it into a fresh virtualenv beside the newest transformers
# (which brings Hugging Face's `kernels` package), as a user's ML environment would have it.
# Checks: pip check; transformers and strand import in one process; the wheel puts nothing but
# `strand` (and its dist-info) at the top of site-packages; `strand demo` on a tiny model runs from
# outside the checkout. Usage: scripts/check_wheel.sh [WORK_DIR]  (CI passes its scratch folder)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
WORK="${1:-$(mktemp -d)}"
PYTHON="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

rm -rf "$WORK/dist" "$WORK/wheel-venv" "$WORK/tiny"
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$REPO" 2>/dev/null \
  || "$PYTHON" -m pip wheel -q --no-deps -w "$WORK/dist" "$REPO"
wheel="$(ls "$WORK"/dist/strand-*.whl)"
echo "check_wheel: built $(basename "$wheel")"
"$PYTHON" -m venv "$WORK/wheel-venv"
venv_python="$WORK/wheel-venv/bin/python"
"$venv_python" -m pip install -q -U pip
"$venv_python" -m pip install -q "$wheel" transformers
"$venv_python" -m pip list --format=freeze | grep -iE '^(strand|transformers|kernels|torch)=='
"$venv_python" -m pip check

cd "$WORK"  # outside the checkout: only the installed wheel can be imported
"$venv_python" - <<'PY'
import importlib.metadata as md
import pathlib

import transformers
from transformers import LlamaForCausalLM  # noqa: F401  (imports Hugging Face's `kernels`)

import strand
from strand import LLM, AsyncLLM, EngineArgs, LLMEngine, SamplingParams  # noqa: F401

assert "site-packages" in strand.__file__, f"strand imported from {strand.__file__}"
top = {pathlib.PurePosixPath(str(f)).parts[0] for f in md.files("strand") or []
       if not str(f).startswith("..")}
expected = {"strand", f"strand-{md.version('strand')}.dist-info"}
assert top == expected, f"the wheel puts {sorted(top - expected)} at the top of site-packages"
print(f"check_wheel: transformers {transformers.__version__} and strand {strand.__version__} "
      f"import together; top level: {sorted(top)}")
PY
"$WORK/wheel-venv/bin/strand" make-tiny-model "$WORK/tiny" >/dev/null
"$WORK/wheel-venv/bin/strand" demo --model "$WORK/tiny"
echo "check_wheel: ok"
