#!/usr/bin/env bash
# probe.sh — play one model on every cell of the design space, hinted and unhinted (docs/curriculum.md).
#
#   MODEL=runs/curriculum/seed0/model/warm OUT=runs/curriculum/seed0/probe0 bash recipes/curriculum/probe.sh
#
# One env per cell (`spade design --pool space-grid`: trainable and held-out cells), K seed pairs
# each, on the probe's own seeds (PROBE_SEED, never a loop seed); `spade regret` turns the episodes
# into each cell's hinted and unhinted means and gain. recipes/curriculum/summarize.py reads them.
set -euo pipefail
MODEL="${MODEL:?set MODEL}" OUT="${OUT:?set OUT}" K="${K:-16}" PROBE_SEED="${PROBE_SEED:-7000}"
MAX_TURNS="${MAX_TURNS:-6}"
ROLLOUT_ARGS="${ROLLOUT_ARGS:-}"   # e.g. --no-thinking for a model whose chat template has no thinking mode
spade design --pool space-grid --n 30 --out "$OUT/designs.jsonl"
spade validate --designs "$OUT/designs.jsonl" --out "$OUT/validated.jsonl"
spade rollout --model "$MODEL" --envs "$OUT/validated.jsonl" --k "$K" --max-turns "$MAX_TURNS" \
  --max-tokens 16 --temperature 1.0 --seed "$PROBE_SEED" --out "$OUT/rollouts.jsonl" $ROLLOUT_ARGS
spade regret --envs "$OUT/validated.jsonl" --rollouts "$OUT/rollouts.jsonl" --out "$OUT/scores.jsonl" --no-seed-audit
