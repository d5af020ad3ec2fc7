#!/usr/bin/env bash
# Baseline: a statically synthesized pool. The initial model designs POOL_SIZE environments once
# (grounded, no memory), they are validated, and the loop then trains the Agent on that fixed pool
# at the same budget as the main run: the pool is dealt to N_ENVS environments per iteration.
#
#   MODEL=Qwen/Qwen3-4B RUN=runs/base_static POOL_SIZE=480 bash recipes/baselines/static_pool.sh
#
# The pool is designed with the main arm's settings, read from recipes/loop.sh (PRINT_SETTINGS=1):
# the same MODEL, CORPUS, GROUP, SEED, BACKEND/BASE_URL, DESIGN_ARGS (Qwen3 thinking and sampling by
# default) and VALIDATE_ARGS, so the arms differ in what the Designer is for, not in how it samples.
# PRINT_SETTINGS=1 prints those settings with POOL=static:POOL_SIZE and exits.
#
# Restartable like loop.sh: design and validate skip when their manifests match, and the pool file
# is rewritten with the same content. RUN is relative to the caller's directory.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RUN="${RUN:-runs/base_static}"
POOL_SIZE="${POOL_SIZE:-480}"
SPADE="${SPADE:-spade}"
# the loop's resolved settings, one `NAME=value` a line, shell-quoted
settings="$(PRINT_SETTINGS=1 POOL="" bash "$HERE/../loop.sh")"
if [[ "${PRINT_SETTINGS:-0}" == 1 ]]; then
  python3 -c 'import json, sys; s = json.loads(sys.argv[1]); s["POOL"] = "static:" + sys.argv[2]
print(json.dumps(s, indent=1))' "$settings" "$POOL_SIZE"
  exit 0
fi
eval "$(python3 -c 'import json, shlex, sys
for k, v in json.loads(sys.argv[1]).items():
    print(f"{k}={shlex.quote(v)}")' "$settings")"
echo "== static pool: MODEL=$MODEL RUN=$RUN POOL_SIZE=$POOL_SIZE SEED=$SEED CORPUS=${CORPUS:-bundled}" >&2
design_flags=(--model "$MODEL" --group "$GROUP" --backend "$BACKEND")
[[ -n "$BASE_URL" ]] && design_flags+=(--base-url "$BASE_URL")
if [[ "$GROUNDING" == 1 ]]; then
  [[ -n "$CORPUS" ]] && design_flags+=(--corpus "$CORPUS")
else
  design_flags+=(--no-grounding)
fi
mkdir -p "$RUN/pool"
# shellcheck disable=SC2086
"$SPADE" design "${design_flags[@]}" --n "$POOL_SIZE" --seed "$SEED" --iteration 0 \
  --out "$RUN/pool/designs.jsonl" $DESIGN_ARGS
# shellcheck disable=SC2086
"$SPADE" validate --designs "$RUN/pool/designs.jsonl" --out "$RUN/pool/validated.jsonl" $VALIDATE_ARGS
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
