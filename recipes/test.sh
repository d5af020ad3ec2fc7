#!/usr/bin/env bash
# Set up a virtual environment with the CPU build of torch and run the default test tiers.
#   bash recipes/test.sh            # unit + integration
#   bash recipes/test.sh -k regret  # extra pytest arguments pass through
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build on CPU machines.
"$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0
"$VENV/bin/pip" install -q --disable-pip-version-check -e '.[dev]'
exec "$VENV/bin/python" -m pytest "$@"
