#!/usr/bin/env bash
# designer_probe.sh — every Designer checkpoint of a run on one fixed prompt set, played by one fixed Agent.
#
#   RUN=runs/demo MODEL=ckpt/warm bash recipes/designer_probe.sh && spade report runs/demo
#   RUN=... MODEL=... AGENT=ckpt/other N=32 K=8 EVERY=10 DESIGN_ARGS="--contract spec ..." bash recipes/designer_probe.sh
#
# Is the Designer improving? A run's own validity and regret mix three changes: the Designer, its
# prompts (the memory grows) and the Agent that plays its designs (it trains too). Here checkpoint i
# (RUN/ckpt/iter_i; MODEL, the run's starting model, at 0) answers the same N prompts (`spade design
# --seed PROMPT_SEED`, iteration 0, no memory), and AGENT (default MODEL: the starting Agent) plays
# its valid designs K seed pairs each on the probe's own seeds; `spade regret` scores them. Output:
# RUN/designer_probe/iter_i/{designs,validated,rollouts,scores}.jsonl; `spade report RUN` adds the
# probe_* columns and designer_probe.png (docs/report.md). Pass the run's own DESIGN_ARGS and
# ROLLOUT_ARGS, so the prompts and the play are the run's. A checkpoint retention removed is
# skipped: run this as the run goes, or keep checkpoints. Rerunnable: a finished step is "up to date".
set -euo pipefail
RUN="${RUN:?set RUN}" MODEL="${MODEL:?set MODEL (the starting model of the run)}" AGENT="${AGENT:-${MODEL}}"
N="${N:-16}" GROUP="${GROUP:-4}" K="${K:-4}" MAX_TURNS="${MAX_TURNS:-6}"
PROMPT_SEED="${PROMPT_SEED:-9000}" PROBE_SEED="${PROBE_SEED:-9100}"   # never a loop's seeds
EVERY="${EVERY:-1}"   # every EVERY-th checkpoint and the last: a long run probed in a fraction of the time
DESIGN_ARGS="${DESIGN_ARGS:-}" ROLLOUT_ARGS="${ROLLOUT_ARGS:-}"
checkpoints=("0 $MODEL")
for dir in "$RUN"/ckpt/iter_[0-9][0-9][0-9][0-9]; do
  # finished (its manifest) and not pruned (retention's marker in stages/prune.py: weights deleted)
  if [[ -f "$dir.manifest.json" && ! -e "$dir/pruned.json" ]]; then checkpoints+=("$((10#${dir##*_})) $dir"); fi
done
last="${checkpoints[-1]%% *}"
for entry in "${checkpoints[@]}"; do
  read -r i ckpt <<<"$entry"
  ((i % EVERY == 0 || i == last)) || continue
  out="$(spade paths "$RUN" -i "$i" --key designer_probe)"
  # shellcheck disable=SC2086
  spade design --model "$ckpt" --n "$N" --group "$GROUP" --seed "$PROMPT_SEED" --out "$out/designs.jsonl" $DESIGN_ARGS
  spade validate --designs "$out/designs.jsonl" --out "$out/validated.jsonl"
  # shellcheck disable=SC2086
  spade rollout --model "$AGENT" --envs "$out/validated.jsonl" --k "$K" --max-turns "$MAX_TURNS" \
    --seed "$PROBE_SEED" --out "$out/rollouts.jsonl" $ROLLOUT_ARGS
  spade regret --envs "$out/validated.jsonl" --rollouts "$out/rollouts.jsonl" --out "$out/scores.jsonl" --no-seed-audit
done
