"""False positives of `spade validate`'s reward-hack checks on learnable envs, and their cost.

Two measurements, both through the real stage core (``stages.validate.run``) in the sandbox:

* ``trivial`` on a learnable game: N files of a higher/lower guessing game over 1-100 with eight
  guesses, each with its own comment (so its own env id and seeds). A file counts as rejected by
  the one-seed rule when a degenerate policy's contract episode reached ``trivial_return`` (read
  from the row's ``stats.returns``), and by the confirmed rule when its reason is ``trivial``.
* every reward-hack check (``trivial``, ``hint_is_answer``, ``answer_table``, ``format_only``) on
  the bundled pool, the starter envs, the tests' benign envs and the quickstart's family designs
  (``spade_cli/envs/family.py``): how many rows each check rejects, and the probe episodes it played.

Prints one JSON line. Example::

    .venv/bin/python recipes/bench_hacks.py --files 300 --workers 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GUESS = '''# variant {i}
import re
import gymnasium as gym
class Guess(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(1, 101))
        self.left = 8
        return "Guess my number from 1 to 100. You have 8 guesses.", {{}}
    def step(self, action):
        m = re.search(r"\\d+", action)
        g = int(m.group()) if m else None
        self.left -= 1
        if g == self.secret:
            return "Correct!", 1.0, True, False, {{}}
        note = "Not a number." if g is None else ("Higher." if g < self.secret else "Lower.")
        return note, 0.0, self.left <= 0, False, {{}}
'''
HINT = "Binary search from 50: guess 50, then halve the interval after each higher/lower."
CHECKS = ("trivial", "hint_is_answer", "answer_table", "format_only")


def _rows(envs: list[dict], source: str) -> list[dict]:
    # pool rows: among themselves only identical code is a duplicate (variants differ in a comment)
    return [{"schema": "spade.design/1", "title": e.get("title") or e.get("name"), "code": e["code"],
             "hint": e["hint"], "gen": {"backend": "pool"}, "doc": {"id": source, "source": source, "text": ""}}
            for e in envs]


def _validate(rows: list[dict], workdir: Path, name: str, workers: int | None) -> tuple[list[dict], float]:
    from stages import validate

    designs, out = workdir / f"{name}.jsonl", workdir / f"{name}.validated.jsonl"
    designs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t0 = time.perf_counter()
    validate.run(designs, out, workers=workers, force=True)
    return [json.loads(x) for x in out.read_text().splitlines()], time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=300, help="guessing-game files for the trivial measurement")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    from spade_cli.envs import family
    from spade_cli.envs import pool as pools

    tests = Path(__file__).resolve().parents[1] / "tests" / "envs_benign"
    benign = [{"name": n, "code": (tests / n).read_text(), "hint": h}
              for n, h in json.loads((tests / "hints.json").read_text()).items()] if tests.exists() else []
    sets = {"bundled": pools.load_folder(pools.pool_path("bundled")),
            "starter": pools.load_folder(pools.pool_path("starter")), "benign": benign,
            "family": family.members(0)}
    report: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        guess = [{"name": f"guess{i}", "code": GUESS.format(i=i), "hint": HINT} for i in range(args.files)]
        got, secs = _validate(_rows(guess, "guess"), work, "guess", args.workers)
        one_seed = sum(any(v >= 0.8 for k, v in g["stats"]["returns"].items() if k != "scripted") for g in got)
        report["guess_trivial"] = {"files": len(got), "one_seed_rule": one_seed,
                                   "confirmed_rule": sum(g["reason"] == "trivial" for g in got),
                                   "other_invalid": dict(Counter(g["reason"] for g in got
                                                                 if g["reason"] not in (None, "trivial"))),
                                   "seconds": round(secs, 2)}
        for name, envs in sets.items():
            got, secs = _validate(_rows(envs, name), work, name, args.workers)
            failed = Counter(c["name"] for g in got for c in g["checks"] if not c["ok"] and c["name"] in CHECKS)
            table = [g["stats"].get("probes", {}).get("answer_table") for g in got]
            # episodes validate played: 4 contract + 1 determinism per design, and every probe's
            # (confirming episodes of a hit not counted: none of these sets has one)
            probes = sum(p["episodes"] for g in got for p in g["stats"].get("probes", {}).values())
            report[name] = {"envs": len(got), "valid": sum(g["valid"] for g in got), "rejected_by": dict(failed),
                            "answer_table_played": sum(t is not None for t in table),
                            "answer_table_episodes": sum(t["episodes"] for t in table if t),
                            "episodes": 5 * len(got) + probes, "seconds": round(secs, 2)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
