"""Benchmark: torch with 1 vs 2 CPU threads, on a quiet core and beside a busy one.

Why `spade --threads` exists: an OpenMP thread whose partner lost its core spin-waits at every
barrier. Each case runs in a fresh process (the thread count is fixed before torch is imported, as
spade_cli/core/threads.py does): a small matmul loop and a greedy generate of a random two-layer Qwen3,
each with 1 and 2 threads, first alone, then beside a burner process spinning on one core. The
baseline is 1 thread in the same condition, measured in the same run; the figure is the time
ratio 2 threads / 1 thread (above 1: the second thread hurts). Medians of REPEATS runs.

    .venv/bin/python recipes/bench_threads.py          # prints one JSON line
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

REPEATS = int(os.environ.get("REPEATS", "5"))

CASE = r"""
import json, sys, time
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
kind = sys.argv[1]
torch.manual_seed(0)
if kind == "matmul":
    a, b = torch.randn(192, 192), torch.randn(192, 192)
    work = lambda: [a @ b for _ in range(200)]
else:
    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    model = Qwen3ForCausalLM(cfg).eval()
    ids = torch.randint(0, 512, (4, 32))
    def work():
        with torch.no_grad():
            model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0)
work()  # warm-up: thread pool, allocator
t0 = time.perf_counter(); work()
print(json.dumps({"s": time.perf_counter() - t0, "threads": torch.get_num_threads()}))
"""


def burn(stop: mp.Event) -> None:  # type: ignore[valid-type]
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def once(kind: str, threads: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", CASE, kind], env=env, capture_output=True, text=True, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["threads"] == threads, row
    return row["s"]


def median_s(kind: str, threads: int) -> float:
    return statistics.median(once(kind, threads) for _ in range(REPEATS))


def main() -> None:
    result = {"bench": "threads", "cores": len(os.sched_getaffinity(0)), "repeats": REPEATS,
              "loadavg_1m": round(os.getloadavg()[0], 2)}
    for busy in (False, True):
        stop = mp.Event()
        burner = mp.Process(target=burn, args=(stop,), daemon=True) if busy else None
        if burner:
            burner.start()
            time.sleep(0.5)
        try:
            for kind in ("matmul", "generate"):
                one, two = median_s(kind, 1), median_s(kind, 2)
                tag = f"{kind}_{'busy' if busy else 'alone'}"
                result[f"{tag}_1thread_s"] = round(one, 4)  # the baseline
                result[f"{tag}_2threads_s"] = round(two, 4)
                result[f"{tag}_ratio_2_over_1"] = round(two / one, 2)
        finally:
            if burner:
                stop.set()
                burner.join(5)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
