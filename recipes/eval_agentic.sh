#!/usr/bin/env bash
# eval_agentic.sh — the paper's tool-use and code suites (BFCL v4, ACEBench, tau2-bench, LiveCodeBench v6)
# through evalscope, against the checkpoint served here by `spade serve` (docs/backends.md).
#
#   MODEL=runs/main/ckpt/iter_0400 OUT=runs/main/eval/agentic_0400.jsonl bash recipes/eval_agentic.sh
#   BASE_URL=http://node7:8000/v1 MODEL=served-name OUT=eval.jsonl bash recipes/eval_agentic.sh   # server already up
#
# evalscope pins library versions that conflict with spade's (datasets, huggingface_hub), so it
# lives in its own virtual environment (EVALSCOPE_VENV, created on first use); spade calls its
# `evalscope` executable as a subprocess. The benchmarks download their data on first use (from
# ModelScope or the Hugging Face hub), so the first run needs network access; tau2-bench also needs
# a user-simulator model (see evalscope's tau2_bench docs) configured through EVAL_ARGS.
# Restartable: `spade eval` skips benchmarks already in OUT's partial output.
set -euo pipefail

MODEL="${MODEL:?set MODEL to a checkpoint directory (or the served model name with BASE_URL)}"
OUT="${OUT:?set OUT to the eval.jsonl to write}"
TASKS="${TASKS:-evalscope:bfcl_v4,evalscope:acebench,evalscope:tau2_bench,evalscope:live_code_bench}"
LIMIT="${LIMIT:-}"                       # items per benchmark (empty: all)
PORT="${PORT:-8000}"
BASE_URL="${BASE_URL:-}"                 # empty: `spade serve` MODEL on PORT here (state in OUT.serve/)
TP="${TP:-1}"                            # tensor parallel size of the server
MAX_MODEL_LEN="${MAX_MODEL_LEN:-32768}"
MAX_TOKENS="${MAX_TOKENS:-16384}"
EVALSCOPE_VENV="${EVALSCOPE_VENV:-.venv-evalscope}"
EVALSCOPE_VERSION="${EVALSCOPE_VERSION:-1.14.1}"
EVAL_ARGS="${EVAL_ARGS:-}"               # extra flags for `spade eval`
SPADE="${SPADE:-spade}"

echo "== eval_agentic: model=$MODEL tasks=$TASKS out=$OUT limit=${LIMIT:-all} base_url=${BASE_URL:-<spade serve on :$PORT>}" >&2

if [[ ! -x "$EVALSCOPE_VENV/bin/evalscope" ]]; then
  python3 -m venv "$EVALSCOPE_VENV"
  "$EVALSCOPE_VENV/bin/pip" install --quiet "evalscope==$EVALSCOPE_VERSION"
fi

if [[ -z "$BASE_URL" ]]; then  # spade serve returns once the server answers /health; stopped on exit
  serve=(--run-dir "$OUT.serve")
  trap '"$SPADE" serve "${serve[@]}" --do stop >/dev/null || true' EXIT
  "$SPADE" serve "${serve[@]}" --model "$MODEL" --port "$PORT" --tensor-parallel-size "$TP" --max-model-len \
    "$MAX_MODEL_LEN" --engine-arg enable_auto_tool_choice=true --engine-arg tool_call_parser=hermes >/dev/null
  BASE_URL="http://127.0.0.1:$PORT/v1"
fi
# shellcheck disable=SC2086
"$SPADE" eval --model "$MODEL" --backend openai --base-url "$BASE_URL" --tasks "$TASKS" --out "$OUT" \
  --max-tokens "$MAX_TOKENS" --evalscope-bin "$EVALSCOPE_VENV/bin/evalscope" ${LIMIT:+--limit "$LIMIT"} $EVAL_ARGS
