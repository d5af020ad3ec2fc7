#!/usr/bin/env bash
# Baseline: a statically synthesized pool. The initial model designs POOL_SIZE environments once
# (grounded, no memory), they are validated, and the loop then trains the Agent on that fixed pool
# at the same budget as the main run: the pool is dealt to N_ENVS environments per iteration.
#
#   MODEL=Qwen/Qwen3-4B RUN=runs/base_static POOL_SIZE=480 bash recipes/baselines/static_pool.sh
#
# The pool is iteration 0's design and validation of the main arm (`spade plan`, in RUN/pool): the
# same MODEL, CORPUS, GROUP, SEED, BACKEND/BASE_URL, DESIGN_ARGS (Qwen3 thinking and sampling by
# default) and VALIDATE_ARGS, so the arms differ in what the Designer is for, not in how it samples.
# PRINT_SETTINGS=1 prints the settings with POOL=static:POOL_SIZE and exits.
# Restartable like loop.sh: design and validate skip when their manifests match.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RUN="${RUN:-runs/base_static}" POOL_SIZE="${POOL_SIZE:-480}" SPADE="${SPADE:-spade}"
[[ "${PRINT_SETTINGS:-0}" != 1 ]] || POOL="static:$POOL_SIZE" exec "$SPADE" plan --print-settings
out="$(RUN="$RUN/pool" ITERS=1 N_ENVS="$POOL_SIZE" POOL="" MEMORY=0 PIPELINE=0 "$SPADE" plan --iteration 0 --shell)"
eval "$out"
echo "== static pool: RUN=$RUN POOL_SIZE=$POOL_SIZE MODEL=$designer" >&2
mkdir -p "$RUN/pool/iter_0000"
"${design[@]}"
"${validate[@]}"
# only the valid environments form the pool
python3 - "$RUN/pool/iter_0000/validated.jsonl" "$RUN/pool/valid.jsonl" <<'PY'
import json, os, sys
src, dst = sys.argv[1:]
rows = [r for r in map(json.loads, open(src)) if r.get("valid")]
if not rows:
    sys.exit(f"{src}: no valid environment, so no static pool")
with open(dst + ".tmp", "w") as fh:
    fh.writelines(json.dumps(r) + "\n" for r in rows)
os.replace(dst + ".tmp", dst)
print(f"{len(rows)} valid environments in the static pool", file=sys.stderr)
PY
POOL="$RUN/pool/valid.jsonl" RUN="$RUN" exec bash "$HERE/../loop.sh"
