"""Benchmark: wall time of `spade --help` next to a bare `python -c pass`, in one run.

    python recipes/bench_cli.py [--repeat 15]

Prints one JSON line: the medians and their ratio. Target: `spade --help` median < 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def median_wall(cmd: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat + 2):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])  # the first two warm the page cache


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    base = median_wall([sys.executable, "-c", "pass"], args.repeat)
    help_ = median_wall([sys.executable, "-m", "spade_cli", "--help"], args.repeat)
    print(json.dumps({"python_pass_s": round(base, 4), "spade_help_s": round(help_, 4),
                      "ratio": round(help_ / base, 2), "target_s": 0.5, "ok": help_ < 0.5}))


if __name__ == "__main__":
    main()
