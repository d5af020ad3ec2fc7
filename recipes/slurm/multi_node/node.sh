#!/usr/bin/env bash
# One server of a fleet, on node NODE (default SLURM_NODEID) of the fleet's job: serves CKPT, prints
# "ready NODE HOST:PORT" on stdout once the server answers for it over HTTP, and stays with a server
# it started until that server exits (a load into a running server returns at once).
#   SERVER=vllm         `vllm serve CKPT`, TP GPUs an engine, data parallel over the node's NGPU
#   SERVER=transformers `transformers serve CKPT` (pinned to it: answers for that name only)
#   SERVER=spade        `spade serve --server node-NODE`: starts the node's engine, or loads CKPT into it
# SERVE_HOST (0.0.0.0: reached by hostname), ADDRS (the fleet's HOST:PORT list: a node keeps its port
# across loads), PORT (default a free one), SERVE_ARGS (added to the server's command), SERVE_WAIT_S.
set -euo pipefail
node="${NODE:-${SLURM_NODEID:-0}}" host="${SERVE_HOST:-0.0.0.0}" wait_s="${SERVE_WAIT_S:-1800}" pid=""
read -ra addrs <<<"${ADDRS:-}"
port="${addrs[node]:-}" port="${port##*:}"
port="${port:-${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}}"
addr="$host"
[[ "$addr" != 0.0.0.0 && "$addr" != "::" ]] || addr="$(hostname)"
serve=(spade serve --run-dir "${RUN:?}" --server "node-$node")
trap '[[ -z "$pid" ]] || kill -TERM "$pid" 2>/dev/null || true' EXIT
trap 'exit 143' TERM INT
if [[ "$SERVER" == spade ]]; then
  # shellcheck disable=SC2086
  summary="$("${serve[@]}" --model "${CKPT:?}" --iteration "${ITER:-0}" --host "$host" --port "$port" --wait "$wait_s" $SERVE_ARGS)"
  echo "ready $node $addr:$port"
  read -r action engine < <(python3 -c 'import json, sys; d = json.loads(sys.argv[1]); print(d.get("action"), d["pid"])' "$summary")
  [[ "$action" == *start ]] || exit 0
  # the engine runs detached from spade serve: stay while it lives (its process belongs to this
  # step), and stop it when the fleet is cancelled
  trap '"${serve[@]}" --do stop >/dev/null; exit 143' TERM INT
  tail --pid="$engine" -f /dev/null & pid=$!
  wait "$pid"
  exit 0
fi
tp="${TP:-1}" ngpu="${NGPU:-${SLURM_GPUS_ON_NODE:-8}}"
case "$SERVER" in
  vllm) cmd=(vllm serve "$CKPT" --host "$host" --port "$port" --tensor-parallel-size "$tp" --dtype bfloat16
             --data-parallel-size $((ngpu / tp > 0 ? ngpu / tp : 1)) --logprobs-mode processed_logprobs --max-logprobs 1) ;;
  transformers) cmd=(transformers serve "$CKPT" --host "$host" --port "$port") ;;
  *) echo "SERVER=$SERVER: choose vllm, transformers or spade" >&2; exit 2 ;;
esac
# shellcheck disable=SC2206
cmd+=(${SERVE_ARGS:-})
echo "== $(date -Is) $(hostname) node $node: ${cmd[*]}" >&2
"${cmd[@]}" >&2 & pid=$!
probe="$(python3 -c 'import json, sys; print(json.dumps({"model": sys.argv[1], "prompt": "hi", "max_tokens": 1}))' "$CKPT")"
for ((t = 0; ; t += 2)); do   # ready once it answers a one-token completion for the name the shards request
  kill -0 "$pid" 2>/dev/null || { echo "$SERVER exited before it answered" >&2; exit 1; }
  code="$(curl -s -o /dev/stderr -w '%{http_code}' -m 60 -H 'Content-Type: application/json' -d "$probe" \
          "http://$addr:$port/v1/completions" || true)"
  [[ "$code" != 200 ]] || break
  # up, but refusing the request the rollouts will send (a name mismatch, ...): a setup error
  [[ "$code" != 4* ]] || { echo "$SERVER on $addr:$port answers $code for model '$CKPT'" >&2; exit 1; }
  ((t < wait_s)) || { echo "$SERVER on $addr:$port not answering after ${wait_s}s" >&2; exit 1; }
  sleep 2
done
echo "== $(date -Is) $SERVER answers on $addr:$port for '$CKPT'" >&2
echo "ready $node $addr:$port"
wait "$pid"
