#!/usr/bin/env sh
# Install Arize Phoenix (an OTLP trace UI) into its own virtualenv, .venv-phoenix/ at the repo
# root, unless it is already there. Its own venv because its dependency set is large and pins
# grpcio/protobuf/opentelemetry on its own schedule: it must never move the project's.
# Override the venv with PHOENIX_VENV and the requirement with PHOENIX_REQUIREMENT.
set -e
cd "$(dirname "$0")/.."
VENV="${PHOENIX_VENV:-.venv-phoenix}"
# Pinned: the e2e test uses this release's REST API (/v1/projects/{name}/spans) and UI routes.
REQUIREMENT="${PHOENIX_REQUIREMENT:-arize-phoenix==20.26.1}"
PYTHON="${PYTHON:-python3}"

# Its installed metadata, not `import phoenix` (that import alone takes seconds of CPU).
installed() {
    "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("arize-phoenix"))' \
        2>/dev/null
}
if [ -x "$VENV/bin/phoenix" ] && version="$(installed)"; then
    echo "phoenix_setup: $VENV already has arize-phoenix $version"
    exit 0
fi
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "$REQUIREMENT"
echo "phoenix_setup: installed $REQUIREMENT into $VENV (start it: $VENV/bin/phoenix serve)"
