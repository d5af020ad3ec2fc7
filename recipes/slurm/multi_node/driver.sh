#!/usr/bin/env bash
# Multi-node driver: per iteration, CPU stages run here (or in a small job) and the GPU stages are
# submitted as dependent jobs: serve fleet + rollout array → regret → update. Restartable: rerun it
# and every finished stage is "up to date".
#
#   MODEL=Qwen/Qwen3-8B RUN=runs/big ITERS=400 SHARDS=16 SERVE_NODES=4 UPDATE_NODES=2 \
#   SITE_ENV=recipes/slurm/site.env bash recipes/slurm/multi_node/driver.sh
set -euo pipefail
[[ -n "${SITE_ENV:-}" ]] && source "$SITE_ENV"
MODEL="${MODEL:?}"; RUN="${RUN:-runs/spade}"; ITERS="${ITERS:-400}"; SHARDS="${SHARDS:-16}"
SERVE_NODES="${SERVE_NODES:-4}"; UPDATE_NODES="${UPDATE_NODES:-2}"; N_ENVS="${N_ENVS:-24}"; SEED="${SEED:-0}"
HERE="$(cd "$(dirname "$0")" && pwd)"
echo "== multi-node driver: RUN=$RUN MODEL=$MODEL ITERS=$ITERS SHARDS=$SHARDS" >&2
for ((i = 0; i < ITERS; i++)); do
  p() { spade paths "$RUN" -i "$i" --key "$1"; }
  ckpt="$(p ckpt)"; ((i == 0)) && ckpt="$MODEL"
  [[ -f "$(p next_ckpt).manifest.json" ]] && continue   # iteration complete
  # design + validate on a GPU node through vLLM (short jobs), waiting for completion
  # the memory of this iteration (absent in iteration 0; never changed once written, so a rerun of
  # any stage of this iteration sees the inputs of its first run)
  mem=(); [[ -f "$(p memory)" ]] && mem=(--memory "$(p memory)")
  srun --gpus=1 --time=01:00:00 spade design --model "$ckpt" --backend vllm --n "$N_ENVS" --iteration "$i" \
    --seed "$SEED" --out "$(p designs)" "${mem[@]}"
  spade validate --designs "$(p designs)" --out "$(p validated)" "${mem[@]}"
  serve=$(sbatch --parsable --nodes="$SERVE_NODES" --export=ALL,CKPT="$ckpt",RUN="$RUN" "$HERE/serve.sbatch")
  fleet_ready() {
    [[ -s "$RUN/servers.txt" ]] || return 1
    local s
    while read -r s; do curl -sf "http://$s/health" >/dev/null || return 1; done < "$RUN/servers.txt"
  }
  # wait (bounded) until every server of the fleet answers its health check
  for ((t = 0; ; t += 10)); do
    fleet_ready && break
    ((t < ${SERVE_WAIT_S:-1800})) || { echo "vllm fleet not ready after ${SERVE_WAIT_S:-1800}s" >&2; exit 1; }
    sleep 10
  done
  arr=$(sbatch --parsable --wait --array=0-$((SHARDS - 1)) --export=ALL,RUN="$RUN",ITER="$i",MODEL="$MODEL" \
    "$HERE/rollout_array.sbatch")
  scancel "$serve"
  spade regret --envs "$(p validated)" --rollouts "$(p rollouts_glob)" --out "$(p scores)" \
    "${mem[@]}" --memory-out "$(p next_memory)" --iteration "$i"
  sbatch --wait --nodes="$UPDATE_NODES" --export=ALL,RUN="$RUN",ITER="$i",MODEL="$MODEL" "$HERE/update.sbatch"
  echo "== iteration $i done (rollout array $arr)" >&2
done
spade report "$RUN"
