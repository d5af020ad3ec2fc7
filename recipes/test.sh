#!/usr/bin/env bash
# Set up the virtual environment (recipes/setup.sh) and run the default test tiers.
#   bash recipes/test.sh            # unit + integration
#   bash recipes/test.sh -k regret  # extra pytest arguments pass through
set -euo pipefail
cd "$(dirname "$0")/.."
bash recipes/setup.sh
exec "${VENV:-.venv}/bin/python" -m pytest "$@"
