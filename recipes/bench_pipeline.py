"""Benchmark: the pipelined loop (``PIPELINE=1``) next to the sequential one, with stand-in stages.

What is measured is the schedule of the two loop scripts, not the stages: both run the real
``recipes/loop.sh`` (which hands over to ``recipes/loop_pipelined.sh`` with ``PIPELINE=1``), with
``SPADE`` and ``UPDATE_CMD`` pointing at a stand-in script (bash: starting Python would cost more
than a short stage). A stand-in stage sleeps for a set time and writes its ``--out`` (and
``--memory-out``, ``--replay-out``) with a manifest, so the loops' restart checks see finished
work; ``spade plan`` is the real one, which gives both loops their stage calls. Generation (design + validate + rollout + regret) and the update take
``--gen-s`` and ``--train-s`` seconds per iteration (equal by default, the case the pipelined
loop is built for: on one node, generation and training on separate GPUs). Sleeping stand-ins
leave the CPU free, as GPU stages would.

The two loops run one after the other in the same process, on fresh run directories. Printed, as
one JSON line: each loop's wall time, the ratio pipelined / sequential, and the ideal ratio for
this schedule, ``(gen + (ITERS - 1) * max(gen, train) + train) / (ITERS * (gen + train))``.

    .venv/bin/python recipes/bench_pipeline.py                     # 10 iterations, 2 s + 2 s
    .venv/bin/python recipes/bench_pipeline.py --iters 20 --gen-s 2 --train-s 1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Of one iteration's generation time, the share each stage sleeps (the rollout is most of it).
GEN_SHARE = {"design": 0.25, "validate": 0.05, "rollout": 0.6, "regret": 0.1}


# The stand-in `spade`, in bash: a Python start costs more than a short stage on a loaded machine.
# `plan` is the real one (this interpreter's spade_cli): the schedule under measure.
STAND_IN = r"""#!/usr/bin/env bash
set -euo pipefail
[[ $1 != plan ]] || exec {PYTHON} -m spade_cli "$@"
cmd=$1; shift
declare -A opt=()
while (($#)); do [[ "$1" == --* && $# -gt 1 ]] && opt[$1]=$2; shift; done
case $cmd in
  update) sleep "$BENCH_TRAIN_S" ;;
  design) sleep "$BENCH_DESIGN_S" ;; validate) sleep "$BENCH_VALIDATE_S" ;;
  rollout) sleep "$BENCH_ROLLOUT_S" ;; regret) sleep "$BENCH_REGRET_S" ;;
esac
for flag in --out --memory-out --replay-out; do
  out=${opt[$flag]:-}
  [[ -n $out ]] || continue
  mkdir -p "${out%/*}"
  if [[ $cmd == update ]]; then mkdir -p "$out"; else : >"$out"; fi
  echo "{\"stage\": \"$cmd\"}" >"$out.manifest.json"
done
""".replace("{PYTHON}", shlex.quote(sys.executable))


def timed_loop(work: Path, spade: Path, iters: int, pipelined: bool) -> float:
    env = {**os.environ, "SPADE": str(spade), "UPDATE_CMD": str(spade), "MODEL": "base-model",
           "RUN": str(work / ("pipelined" if pipelined else "sequential")), "ITERS": str(iters),
           "EVAL_EVERY": "0", "PIPELINE": "1" if pipelined else "0"}
    t0 = time.perf_counter()
    res = subprocess.run(["bash", str(REPO / "recipes" / "loop.sh")], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise SystemExit(f"the {'pipelined' if pipelined else 'sequential'} loop failed:\n{res.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--gen-s", type=float, default=2.0, help="generation seconds per iteration")
    ap.add_argument("--train-s", type=float, default=2.0, help="update seconds per iteration")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        work = Path(tmp)
        spade = work / "spade"
        spade.write_text(STAND_IN)
        spade.chmod(spade.stat().st_mode | stat.S_IXUSR)
        os.environ.update(BENCH_TRAIN_S=str(args.train_s),
                          **{f"BENCH_{k.upper()}_S": str(args.gen_s * v) for k, v in GEN_SHARE.items()})
        seq = timed_loop(work, spade, args.iters, pipelined=False)
        pipe = timed_loop(work, spade, args.iters, pipelined=True)
    g, t, n = args.gen_s, args.train_s, args.iters
    print(json.dumps({"bench": "pipeline", "iters": n, "gen_s": g, "train_s": t,
                      "sequential_s": round(seq, 2), "pipelined_s": round(pipe, 2),
                      "ratio": round(pipe / seq, 3), "ideal_ratio": round((g + (n - 1) * max(g, t) + t) / (n * (g + t)), 3)}))


if __name__ == "__main__":
    main()
