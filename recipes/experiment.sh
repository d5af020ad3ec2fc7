#!/usr/bin/env bash
# experiment.sh — the paper's comparison: arms x seeds of recipes/loop.sh in one directory, then its table.
#
#   MODEL=Qwen/Qwen3-4B EXP=runs/exp bash recipes/experiment.sh              # every arm, seeds 0 1 2
#   MODEL=... EXP=runs/exp ARMS="spade hand_curated" SEEDS="0 1" ITERS=50 bash recipes/experiment.sh
#   DRY_RUN=1 ARMS="spade ema_lp" SEEDS="0 1" bash recipes/experiment.sh   # list the cells, run nothing
#   MODEL=... DRY_RUN=settings bash recipes/experiment.sh   # each cell's settings.json only
#   # one Slurm array job per cell: recipes/slurm/experiment_array.sbatch
#
# An arm is a name: `spade` (the loop as it is), NAME for recipes/ablations/NAME.env or
# recipes/baselines/NAME.env (given to loop.sh as its CONFIG), or recipes/baselines/NAME.sh (a
# recipe that ends in loop.sh, e.g. static_pool). Cell c is arm c / n_seeds with seed c % n_seeds,
# in EXP/ARM/seed_S with SEED=S; CELL=c runs that cell alone (a Slurm array task), otherwise every
# cell runs in turn and `spade compare EXP` writes EXP/compare/ at the end.
#
# Controls: the knobs that define an arm (POOL FROZEN_DESIGNER SIGNAL GROUNDING MEMORY) are cleared
# before each cell, so arms differ only by their file; every other knob (MODEL, ITERS, N_ENVS, K,
# MAX_TURNS, CORPUS, EVAL_*, *_ARGS, or a CONFIG env file of them) is the same for every arm, and
# loop.sh resolves their defaults in one place (the static pool's designs read them from there too).
# Each cell's resolved settings, shared and arm knobs, are written to EXP/ARM/seed_S/settings.json
# before it runs: two arms' files differ only in their arm's knobs (docs/report.md). Every arm's
# rollout plays BUDGET_PAIRS seed pairs an iteration (N_ENVS * K) over however many envs are valid,
# so each arm plays the same number of Agent episodes per iteration; `spade compare` reports
# episodes and tokens per arm and warns loudly about any arm whose budget or settings still differ.
#
# Restartable: each cell is loop.sh, which resumes at its first incomplete stage. A cell that
# finished writes EXP/ARM/seed_S/experiment.done holding its settings; a rerun with the same
# settings skips it without walking its iterations (about a second each). SIGTERM goes to the
# running cell, which stops at a unit boundary; the script then exits 75, like loop.sh.
set -euo pipefail

if [[ -n "${CONFIG:-}" ]]; then
  set -a  # the experiment's knobs reach every cell's loop.sh
  # shellcheck disable=SC1090
  source "$CONFIG"
  set +a
  unset CONFIG
fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXP="${EXP:-runs/exp}"
ARMS="${ARMS:-spade static_pool hand_curated frozen_designer ema_lp no_grounding no_memory}"
SEEDS="${SEEDS:-0 1 2}"
CELL="${CELL:-}"                    # run only this cell (0-based); empty: all, then compare
DRY_RUN="${DRY_RUN:-0}"             # 1: print "cell arm seed run recipe" per cell and exit;
                                    # settings: write each cell's settings.json, run nothing
COMPARE_ARGS="${COMPARE_ARGS:-}"
SPADE="${SPADE:-spade}"
ARM_KNOBS=(POOL FROZEN_DESIGNER SIGNAL GROUNDING MEMORY)

read -r -a arms <<<"$ARMS"
read -r -a seeds <<<"$SEEDS"
n_cells=$((${#arms[@]} * ${#seeds[@]}))
((n_cells > 0)) || { echo "experiment.sh: ARMS and SEEDS must not be empty" >&2; exit 2; }

# the recipe of an arm: "loop" (no file), "loop FILE.env" or "script FILE.sh"
recipe() {
  local arm=$1 f
  [[ "$arm" == spade ]] && { echo loop; return; }
  for f in "$HERE/ablations/$arm.env" "$HERE/baselines/$arm.env"; do
    [[ -f "$f" ]] && { echo "loop $f"; return; }
  done
  [[ -f "$HERE/baselines/$arm.sh" ]] && { echo "script $HERE/baselines/$arm.sh"; return; }
  local known
  known=$(cd "$HERE" && ls ablations/*.env baselines/*.env baselines/*.sh | xargs -n1 basename | sed 's/\.[a-z]*$//' | tr '\n' ' ')
  echo "experiment.sh: unknown arm '$arm' (known: spade $known)" >&2
  return 2
}

cells=()
if [[ -n "$CELL" ]]; then
  [[ "$CELL" =~ ^[0-9]+$ ]] && ((CELL < n_cells)) || { echo "experiment.sh: CELL=$CELL, not in 0..$((n_cells - 1))" >&2; exit 2; }
  cells=("$CELL")
else
  for ((c = 0; c < n_cells; c++)); do cells+=("$c"); done
fi
for arm in "${arms[@]}"; do recipe "$arm" >/dev/null; done  # every name is checked before any work

echo "== spade experiment: EXP=$EXP ARMS=$ARMS SEEDS=$SEEDS cells=${#cells[@]} of $n_cells" \
     "MODEL=${MODEL:-} ITERS=${ITERS:-400} N_ENVS=${N_ENVS:-24} K=${K:-8}" >&2

child="" stop=0
trap 'stop=1; [[ -z "$child" ]] || kill -TERM "$child" 2>/dev/null || true' TERM
for c in "${cells[@]}"; do
  arm=${arms[c / ${#seeds[@]}]} seed=${seeds[c % ${#seeds[@]}]}
  run="$EXP/$arm/seed_$seed"
  read -r kind file <<<"$(recipe "$arm")"
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "$c $arm $seed $run ${file:-recipes/loop.sh}"
    continue
  fi
  ((stop == 0)) || exit 75
  cmd=(bash "$HERE/loop.sh")
  [[ "$kind" == script ]] && cmd=(bash "$file")
  unset_knobs=()
  for k in "${ARM_KNOBS[@]}"; do unset_knobs+=(-u "$k"); done
  cell_env=(env "${unset_knobs[@]}" RUN="$run" SEED="$seed" SPADE="$SPADE")
  [[ "$kind" == loop && -n "${file:-}" ]] && cell_env+=(CONFIG="$file")
  # the cell's resolved settings, as the recipe that runs it resolves them
  mkdir -p "$run"
  "${cell_env[@]}" PRINT_SETTINGS=1 "${cmd[@]}" >"$run/settings.json.tmp"
  mv "$run/settings.json.tmp" "$run/settings.json"
  [[ "$DRY_RUN" == settings ]] && continue
  # what the cell's artifacts depend on: the arm's file and every knob set in the environment
  settings="$(echo "arm=$arm seed=$seed"; [[ -n "${file:-}" ]] && cat "$file"
              env | grep -E '^(MODEL|ITERS|N_ENVS|GROUP|K|BUDGET_PAIRS|MAX_TURNS|BACKEND|BASE_URL|CORPUS|REPLAY|EVAL_[A-Z]+|POOL_SIZE|[A-Z]+_ARGS|UPDATE_CMD|ROLLOUT_SHARDS)=' | sort || true)"
  if [[ -f "$run/experiment.done" && "$(cat "$run/experiment.done")" == "$settings" ]]; then
    echo "== cell $c ($arm, seed $seed): done" >&2
    continue
  fi
  echo "== cell $c: $arm, seed $seed, in $run" >&2
  rc=0
  "${cell_env[@]}" "${cmd[@]}" &
  child=$!
  wait "$child" || rc=$?
  while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
  child=""
  ((stop == 0)) || { echo "== SIGTERM: cell $c stopped; rerun to resume" >&2; exit 75; }
  ((rc == 0)) || exit "$rc"
  printf '%s' "$settings" >"$run/experiment.done.tmp" && mv "$run/experiment.done.tmp" "$run/experiment.done"
done
[[ "$DRY_RUN" != 0 || -n "$CELL" ]] && exit 0
# shellcheck disable=SC2086
"$SPADE" compare "$EXP" --out "$EXP/compare" $COMPARE_ARGS
