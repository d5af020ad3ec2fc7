"""Benchmark: `spade regret` over 100k rollout rows with realistic token arrays.

Writes a validated.jsonl of N_ENVS envs and a rollouts.jsonl of N_ROWS episodes (hinted and
unhinted, same pairs), each with ~1.5k prompt/completion ids, an env mask and logprobs, then runs
the real CLI in a subprocess and prints its wall time and peak RSS. For scale it also times, in the
same run, a plain read + sha256 of the rollouts (the least any reader pays, since the manifest
records the hash) and json.loads of a sample of full rows, extrapolated.

Targets: < 5 s wall and < 300 MB peak RSS for 100k rows.

Example::

    .venv/bin/python recipes/bench_regret.py --rows 100000 --dir /tmp/bench_regret
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _tail(rng: random.Random, prompt: int, completion: int) -> str:
    """The bulky end of a row: messages, turns and token arrays, JSON-encoded once and reused."""
    mask = [1 if (i // 50) % 2 == 0 else 0 for i in range(completion)]
    tokens = {"prompt_ids": [rng.randrange(150_000) for _ in range(prompt)],
              "completion_ids": [rng.randrange(150_000) for _ in range(completion)], "env_mask": mask,
              "logprobs": [round(-rng.random() * 4, 5) if m else None for m in mask]}
    turns = [{"action": "move north " * 20, "observation": "You see a wall. " * 30, "reward": 0.0}] * 4
    messages = [{"role": "user", "content": "Play the game. " * 60}] + [
        {"role": "assistant", "content": "move north " * 20}, {"role": "user", "content": "You see a wall. " * 30}] * 4
    return json.dumps({"messages": messages, "turns": turns, "terminated": True, "truncated": False,
                       "tokens": tokens}, separators=(",", ":"))[1:]


def generate(d: Path, n_rows: int, n_envs: int, prompt: int, completion: int) -> tuple[Path, Path]:
    rng = random.Random(0)
    envs = []
    for i in range(n_envs):
        code = f"class Env{i}(gym.Env):\n    # task {i} about {rng.choice(['mazes', 'ciphers', 'ledgers'])}\n"
        envs.append({"schema": "spade.validation/1", "code": code, "hint": f"hint {i}", "title": f"Env {i}",
                     "iteration": 0, "valid": True, "reason": None})
    from spade_cli.core.records import env_id_for

    ids = [env_id_for(e["code"], e["hint"]) for e in envs]
    vpath = d / "validated.jsonl"
    vpath.write_text("".join(json.dumps(e) + "\n" for e in envs))
    tails = [_tail(rng, prompt, completion) for _ in range(4)]
    pairs = max(1, n_rows // (2 * n_envs))
    rpath = d / "rollouts.jsonl"
    with open(rpath, "w") as fh:
        for n in range(n_rows):
            env, rest = divmod(n, 2 * pairs)
            hinted, pair = divmod(rest, pairs)
            ret = 1.0 if rng.random() < (0.6 if hinted else 0.3) else 0.0
            head = (f'{{"schema":"spade.rollout/1","episode_id":"ep{n}","env_id":"{ids[env % n_envs]}",'
                    f'"iteration":0,"hinted":{"true" if hinted else "false"},"seed":{1000 + pair},'
                    f'"pair":{pair},"return":{ret},"error":null,')
            fh.write(head + tails[n % 4] + "\n")
    return vpath, rpath


def baseline_read_hash(path: Path) -> float:
    t = time.perf_counter()
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(8 << 20), b""):
            h.update(chunk)
    return time.perf_counter() - t


def baseline_json_loads(path: Path, sample: int, total: int) -> float:
    with open(path, "rb") as fh:
        lines = [fh.readline() for _ in range(sample)]
    t = time.perf_counter()
    for raw in lines:
        json.loads(raw)
    return (time.perf_counter() - t) * total / sample


def run_cli(args: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS in MB and stdout of one `spade` subprocess (rusage of that child)."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "spade_cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"spade regret failed:\n{err.decode()}")
    return wall, usage.ru_maxrss / 1024, out.decode().strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--envs", type=int, default=500)
    ap.add_argument("--prompt-ids", type=int, default=500)
    ap.add_argument("--completion-ids", type=int, default=1_500)
    ap.add_argument("--dir", type=Path, default=None, help="Work directory (default: a temp dir, removed).")
    args = ap.parse_args()
    d = args.dir or Path(tempfile.mkdtemp(prefix="bench_regret_"))
    d.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        vpath, rpath = generate(d, args.rows, args.envs, args.prompt_ids, args.completion_ids)
        size = rpath.stat().st_size
        print(f"generated {args.rows} rows, {size / 1e9:.2f} GB in {time.perf_counter() - t:.1f} s", flush=True)
        base = baseline_read_hash(rpath)
        naive = baseline_json_loads(rpath, min(2_000, args.rows), args.rows)
        cli = ["regret", "--envs", str(vpath), "--rollouts", str(rpath), "--out", str(d / "scores.jsonl"),
               "--memory-out", str(d / "memory.jsonl"), "--embedding", "tfidf", "--force"]
        wall, rss, summary = run_cli(cli)
        again, _, _ = run_cli(cli[:-1])  # up to date: hashes and scans, writes nothing
        s = json.loads(summary)
        timings = json.loads((d / "scores.jsonl.manifest.json").read_text())["timings"]
        print(f"spade regret: {wall:.2f} s wall (target < 5), peak RSS {rss:.0f} MB (target < 300), "
              f"{args.rows / wall:,.0f} rows/s, {size / wall / 1e6:.0f} MB/s")
        print(f"  baseline read+sha256 of the rollouts: {base:.2f} s -> spade regret = {wall / base:.2f}x baseline")
        print(f"  naive json.loads of every row (extrapolated): {naive:.2f} s -> {naive / wall:.1f}x slower than spade")
        print(f"  up-to-date rerun: {again:.2f} s; episodes {s['episodes']}, envs {s['valid']}, "
              f"regret mean {s['regret_mean']:.3f}")
        print(f"  phases of the first run: {timings}")
    finally:
        if args.dir is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
