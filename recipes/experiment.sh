#!/usr/bin/env bash
# experiment.sh — the paper's comparison: arms x seeds of recipes/loop.sh in one directory, then its table.
#
#   MODEL=Qwen/Qwen3-4B EXP=runs/exp bash recipes/experiment.sh              # every arm, seeds 0 1 2
#   MODEL=... EXP=runs/exp ARMS="spade hand_curated" SEEDS="0 1" ITERS=50 bash recipes/experiment.sh
#   DRY_RUN=1 ARMS="spade ema_lp" SEEDS="0 1" bash recipes/experiment.sh   # list the cells, run nothing
#   MODEL=... DRY_RUN=settings bash recipes/experiment.sh   # each cell's settings.json only
#   # one Slurm array job per cell: recipes/slurm/experiment_array.sbatch
#
# An arm is a name: `spade` (the loop as it is), NAME for the settings file recipes/ablations/NAME.env
# or recipes/baselines/NAME.env (added to the loop's CONFIG), or recipes/baselines/NAME.sh (a recipe
# that ends in loop.sh, e.g. static_pool). Cell c is arm c / n_seeds with seed c % n_seeds, in
# EXP/ARM/seed_S (`spade plan --arms` lists them); CELL=c runs that cell alone (a Slurm array task),
# otherwise every cell runs in turn and `spade compare EXP` writes EXP/compare/ at the end.
#
# Controls: the settings that define an arm (POOL FROZEN_DESIGNER SIGNAL GROUNDING MEMORY) come only
# from the arms' files (one set in the environment is refused; a value for every arm goes in CONFIG),
# so arms differ only by their file; every other setting (MODEL, ITERS, N_ENVS, K, ..., the
# experiment's own CONFIG file) is the same for every arm. Each cell's resolved settings are
# written to EXP/ARM/seed_S/settings.json before it runs (`spade plan --print-settings`): two arms'
# files differ only in their arm's settings (docs/report.md).
#
# Restartable: each cell is loop.sh, which resumes at its first incomplete stage. A finished cell
# copies its settings.json to experiment.done; a rerun with the same settings skips it without walking
# its iterations. SIGTERM goes to the running cell, which stops at a unit boundary; then exit 75.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXP="${EXP:-runs/exp}"
ARMS="${ARMS:-spade static_pool hand_curated frozen_designer ema_lp no_grounding no_memory}"
SEEDS="${SEEDS:-0 1 2}"
DRY_RUN="${DRY_RUN:-0}"             # 1: print the cells and exit; settings: write each cell's settings.json
SPADE="${SPADE:-spade}"
cells="$("$SPADE" plan --arms "$ARMS" --seeds "$SEEDS" --exp "$EXP" --cell "${CELL:-}" --recipes "$HERE")"
[[ "$DRY_RUN" != 1 ]] || { echo "$cells"; exit 0; }
echo "== spade experiment: EXP=$EXP ARMS=$ARMS SEEDS=$SEEDS cells: $(wc -l <<<"$cells")" >&2

child="" stop=0
trap 'stop=1; [[ -z "$child" ]] || kill -TERM "$child" 2>/dev/null || true' TERM
while read -r -u 3 c arm seed run recipe; do
  ((stop == 0)) || exit 75
  config="${CONFIG:-}" cmd=(bash "$HERE/loop.sh")
  case "$recipe" in
    *.env) config="${config:+$config:}$recipe" ;;
    */baselines/*.sh) cmd=(bash "$recipe") ;;
  esac
  cell=(env RUN="$run" SEED="$seed" CONFIG="$config")  # no arm setting in the environment: plan refused it
  mkdir -p "$run"
  "${cell[@]}" PRINT_SETTINGS=1 "${cmd[@]}" >"$run/settings.json.tmp"
  mv "$run/settings.json.tmp" "$run/settings.json"
  [[ "$DRY_RUN" != settings ]] || continue
  if cmp -s "$run/settings.json" "$run/experiment.done"; then echo "== cell $c ($arm, seed $seed): done" >&2; continue; fi
  echo "== cell $c: $arm, seed $seed, in $run" >&2
  rc=0
  "${cell[@]}" "${cmd[@]}" &
  child=$!
  wait "$child" || rc=$?
  while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
  child=""
  ((stop == 0)) || { echo "== SIGTERM: cell $c stopped; rerun to resume" >&2; exit 75; }
  ((rc == 0)) || exit "$rc"
  cp "$run/settings.json" "$run/experiment.done.tmp" && mv "$run/experiment.done.tmp" "$run/experiment.done"
done 3<<<"$cells"
[[ "$DRY_RUN" != 0 || -n "${CELL:-}" ]] && exit 0
# shellcheck disable=SC2086
"$SPADE" compare "$EXP" --out "$EXP/compare" ${COMPARE_ARGS:-}
