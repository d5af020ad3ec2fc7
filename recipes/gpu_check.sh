#!/usr/bin/env bash
# gpu_check.sh — spade's update and generation on one GPU without network, in parts that each report.
#
#   bash recipes/gpu_wheels.sh gpu_wheels              # first, on a networked CPU machine (docs/install.md)
#   WHEELS=gpu_wheels bash recipes/gpu_check.sh        # on the GPU machine, the folder beside the checkout
#   DRY=1 bash recipes/gpu_check.sh                    # the CPU path at toy sizes (what the tests run)
#
# Parts, in this order, each under its own time limit (LIMIT_<PART> seconds) and all of them inside
# BUDGET_S (480 s: the whole check takes under 8 minutes; a part the budget cannot fit is skipped;
# DRY=1 has four times the time for everything):
#   install   pip installs the WHEELS folder offline (--no-index --no-deps) into $WORK/site; the
#             image keeps its torch. Without WHEELS the environment is used as it is.
#   build     a random Qwen3-0.6B-shaped model with untied embeddings at Qwen3's vocabulary (151,936),
#             drawn on the device in bf16, and 32 episodes of 1,024 + 5,120 tokens
#   update1   `spade update` under `accelerate launch`, one process, bf16, gradient checkpointing
#   update2   the same from update1's checkpoint, resuming its trainer state
#   zero2     update1 again under DeepSpeed ZeRO-2 (recipes/accelerate/zero2.yaml) in one process;
#             skipped, with the reason, where deepspeed does not import
#   resume    one process takes update1's two passes: its fp32 masters equal the chained updates'
#   generate  the hf backend from update2's checkpoint on the GPU
#   vllm      recipes/gpu_check_generation.sh (vllm backend, `spade serve`); it skips without vllm
# Each update reports tokens/s, seconds per step, the old-log-prob pass's seconds, the trainer
# state's bytes and save/load seconds, peak host and GPU memory. Each part's JSON line is appended
# to $OUT/parts.jsonl the moment it ends (OUT defaults to WORK), its log goes to $WORK/<part>.log
# and $OUT/logs.tgz, so a failure or a timeout costs that part only. The last stdout line (also
# $OUT/summary.json) gathers every part of this run; the exit status is 1 when a part failed.
# PARTS="zero2 resume" reruns some parts in the same WORK. DRY=1 (or no CUDA device): the same
# parts on the CPU at toy sizes in fp32, a check that the script works, not a measurement.
set -euo pipefail

PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"  # python3: the torch one on CUDA images
WORK="${WORK:-$(mktemp -d)}"
OUT="${OUT:-$WORK}"
WHEELS="${WHEELS:-}"
PARTS="${PARTS:-install build update1 update2 zero2 resume generate vllm}"
if [[ -n $WHEELS && ! -d $WHEELS ]]; then
  echo "gpu_check: WHEELS=$WHEELS is not a folder (recipes/gpu_wheels.sh gathers one)" >&2
  exit 2
fi
mkdir -p "$WORK" "$OUT"
WORK="$(cd "$WORK" && pwd)" OUT="$(cd "$OUT" && pwd)" WHEELS="${WHEELS:+$(cd "$WHEELS" && pwd)}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# the checkout's code first, then what the install part puts in $WORK/site, then the image's packages
export PYTHONPATH="$PWD:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
DRY="${DRY:-$((gpus == 0))}"
# the CPU path checks the plumbing, not the time: its limits are 4x, so a busy machine passes too
slack=$((DRY ? 4 : 1))
BUDGET_S="${BUDGET_S:-$((480 * slack))}"
if ((DRY)); then
  export ACCELERATE_USE_CPU=true  # every part on the CPU, also on a machine with a GPU
  shape=dry vocab=1024 n=16 prompt=32 completion=96 batch=4 precision=() gen=(--prompts 2 --n 2 --max-tokens 16)
else
  shape=gpu vocab=151936 n=32 prompt=1024 completion=5120 batch=4 precision=(--bf16) gen=()
fi
vocab="${VOCAB:-$vocab}" n="${N:-$n}" prompt="${PROMPT:-$prompt}" completion="${COMPLETION:-$completion}"
batch="${BATCH:-$batch}"
run_id="$(date +%Y%m%d-%H%M%S)-$$"
t_start=$SECONDS
echo "gpu_check: run $run_id, DRY=$DRY, $gpus GPU(s), WORK=$WORK, OUT=$OUT, WHEELS=${WHEELS:-none}," \
  "budget ${BUDGET_S} s, parts: $PARTS; $n rows of $prompt + $completion tokens, vocab $vocab" >&2

record() { "$PYTHON" recipes/gpu_check_record.py "$1" "$OUT" "${@:2}" --run "$run_id" || echo "gpu_check: $2 not recorded" >&2; }

# part NAME LIMIT NEEDS CMD...: CMD under its own limit (what the budget leaves, if less), once
# $WORK/NEEDS exists ("-": nothing); its last stdout line is its record. Never ends the script.
part() {
  local name=$1 limit=$2 needs=$3 rc=0 t0=$SECONDS left knob="LIMIT_${1^^}"
  shift 3
  [[ " $PARTS " == *" $name "* ]] || return 0
  limit="${!knob:-$((limit * slack))}"
  left=$((BUDGET_S - (SECONDS - t_start) - 5))
  if ((left < 10)); then
    record note "$name" --why "no time left in BUDGET_S=$BUDGET_S"
    return 0
  fi
  if [[ $needs != - && ! -e $WORK/$needs ]]; then
    record note "$name" --why "needs $WORK/$needs, which an earlier part did not write"
    return 0
  fi
  ((limit <= left)) || limit=$left
  echo "gpu_check: $name (limit $limit s)" >&2
  # in the background so that a signal to this script reaches the trap below at once
  timeout -k 15 "$limit" "$@" >"$WORK/$name.out" 2>"$WORK/$name.log" &
  running=$! current=$name
  wait "$running" || rc=$?
  running=
  record part "$name" --rc "$rc" --seconds $((SECONDS - t0)) --limit "$limit" --stdout "$WORK/$name.out" \
    --log "$WORK/$name.log"
  (cd "$WORK" && tar -czf "$OUT/.logs.tgz.tmp" ./*.log && mv -f "$OUT/.logs.tgz.tmp" "$OUT/logs.tgz") || true
}

# the last stdout line: every part this run recorded; returns 1 when a part failed
summary() {
  local dry=false rc=0
  ((DRY)) && dry=true
  "$PYTHON" recipes/gpu_check_record.py summary "$OUT" --run "$run_id" \
    --extra "{\"dry\": $dry, \"gpus\": $gpus, \"budget_s\": $BUDGET_S, \"wall_s\": $((SECONDS - t_start))}" || rc=$?
  if ((rc != 0 && rc != 3)); then  # the summary itself broke: still one line, pointing at the records
    echo "{\"check\": \"gpu_check\", \"run\": \"$run_id\", \"status\": \"no summary\", \"records\": \"$OUT/parts.jsonl\"}"
  fi
  return $((rc != 0))
}
# Interrupted (Ctrl-C, a scheduler's SIGTERM): end the running part (timeout runs it in a process
# group of its own, which the signal does not reach) and still print what finished.
running= current=
stopped() {
  trap - INT TERM
  if [[ -n $running ]]; then
    kill -TERM "$running" 2>/dev/null || true
    wait || true
    record note "$current" --status failed --why "interrupted: this script got a signal"
  fi
  summary || true
  exit 130
}
trap stopped INT TERM

check=(recipes/gpu_check.py)
part install 120 - "$PYTHON" "${check[@]}" install "$WORK" ${WHEELS:+--wheels "$WHEELS"}
part build 120 - "$PYTHON" "${check[@]}" build "$WORK" --shape "$shape" --vocab "$vocab" --n "$n" \
  --prompt "$prompt" --completion "$completion"
part update1 150 model "$PYTHON" "${check[@]}" update "$WORK" ck1 --from model --batch "$batch" "${precision[@]}"
part update2 150 ck1 "$PYTHON" "${check[@]}" update "$WORK" ck2 --from ck1 --batch "$batch" "${precision[@]}"
part zero2 180 ck1 "$PYTHON" "${check[@]}" update "$WORK" ckz --from model --batch "$batch" "${precision[@]}" \
  --zero2 --like ck1
part resume 150 ck2 "$PYTHON" "${check[@]}" resume "$WORK" --first ck1 --chained ck2
start=ck2; [[ -d $WORK/ck2 ]] || start=model
part generate 90 "$start" "$PYTHON" "${check[@]}" generate "$WORK" --from "$start" "${gen[@]}"
part vllm 240 - env WORK="$WORK/vllm" DRY="$DRY" PYTHON="$PYTHON" bash recipes/gpu_check_generation.sh

summary
