#!/usr/bin/env bash
# Set up the virtual environment (recipes/setup.sh) and run the default test tiers.
#   bash recipes/test.sh            # unit + integration
#   bash recipes/test.sh -k regret  # extra pytest arguments pass through
#   bash recipes/test.sh -m "slow or slurm"   # the second tier CI runs (the loop's kill matrix, Slurm)
set -euo pipefail
cd "$(dirname "$0")/.."
bash recipes/setup.sh
# Two pytest workers (pytest-xdist), one test file each at a time: most tests wait on a subprocess,
# a sandbox or a server, so two files in flight use both cores. TEST_WORKERS=0 runs in one process.
exec "${VENV:-.venv}/bin/python" -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
