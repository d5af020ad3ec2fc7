#!/usr/bin/env bash
# Baseline: a statically synthesized pool. The initial model designs POOL_SIZE environments once
# (grounded, no memory), they are validated, and the loop then trains the Agent on that fixed pool
# at the same budget as the main run: the pool is dealt to N_ENVS environments per iteration.
#
#   MODEL=Qwen/Qwen3-4B RUN=runs/base_static POOL_SIZE=480 bash recipes/baselines/static_pool.sh
#
# Restartable like loop.sh: design and validate skip when their manifests match, and the pool file
# is rewritten with the same content. RUN is relative to the caller's directory.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODEL="${MODEL:?set MODEL}"
RUN="${RUN:-runs/base_static}"
POOL_SIZE="${POOL_SIZE:-480}"
GROUP="${GROUP:-4}"
SEED="${SEED:-0}"
BACKEND="${BACKEND:-hf}"
SPADE="${SPADE:-spade}"
echo "== static pool: MODEL=$MODEL RUN=$RUN POOL_SIZE=$POOL_SIZE SEED=$SEED" >&2
mkdir -p "$RUN/pool"
# shellcheck disable=SC2086
"$SPADE" design --model "$MODEL" --n "$POOL_SIZE" --group "$GROUP" --seed "$SEED" --backend "$BACKEND" \
  --iteration 0 --out "$RUN/pool/designs.jsonl" ${DESIGN_ARGS:-}
"$SPADE" validate --designs "$RUN/pool/designs.jsonl" --out "$RUN/pool/validated.jsonl"
# only the valid environments form the pool
python3 - "$RUN/pool/validated.jsonl" "$RUN/pool/valid.jsonl" <<'PY'
import json, os, sys
src, dst = sys.argv[1:]
rows = [r for r in map(json.loads, open(src)) if r.get("valid")]
if not rows:
    sys.exit(f"{src}: no valid environment, so no static pool")
tmp = dst + ".tmp"
with open(tmp, "w") as fh:
    fh.writelines(json.dumps(r) + "\n" for r in rows)
os.replace(tmp, dst)
print(f"{len(rows)} valid environments in the static pool", file=sys.stderr)
PY
POOL="$RUN/pool/valid.jsonl" RUN="$RUN" MODEL="$MODEL" exec bash "$HERE/../loop.sh"
