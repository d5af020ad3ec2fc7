"""Tables of the design-space experiments, from their run directories (docs/curriculum.md).

    python recipes/curriculum/summarize.py gate runs/curriculum
    python recipes/curriculum/summarize.py steering runs/curriculum [--last 3] [--iterations N]

``gate``: per seed, the warm Agent's probe (cells where the hint helps by >= 0.2) and, after the
gate's learning loop, what the Agent gained unhinted on the cells it failed (trainable and
held-out separately). ``steering``: per arm, the true regret of the valid designs of the last
``--last`` iterations (each design's cell looked up on the frozen Agent's probe), the share of
them in learnable cells, validity and the mean level chosen, as mean and 95% interval over seeds; each trained arm
(``regret``, ``pooled``) against each control paired by seed, and, per seed, against each other
arm over the designs themselves (Welch), the one-seed pilot's reading; and how well each arm's
paid reward tracked its designs' true regret (correlation, overall and within GRPO's groups).
Markdown on stdout, the same figures as JSON in ROOT/summary_MODE.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from spade_cli.core.artifacts import read_records
from spade_cli.core.records import to_row
from spade_cli.designer import space
from spade_cli.designer.curriculum import mean, sample_var, t975
from spade_cli.evaluation import cells


def load(path: Path) -> list[dict]:
    return [to_row(r) for r in read_records(path)]


def probe(dir_: Path) -> dict | None:
    if not (dir_ / "scores.jsonl").exists():
        return None
    return cells.cell_table(load(dir_ / "validated.jsonl"), load(dir_ / "scores.jsonl"))


def interval(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    m = mean(xs)
    if len(xs) < 2:
        return f"{m:.3f} (n=1)"
    half = t975(len(xs) - 1) * (sample_var(xs) / len(xs)) ** 0.5
    return f"{m:.3f} ± {half:.3f} (n={len(xs)})"


def welch(a: list[float], b: list[float]) -> str:
    """Mean of ``a`` minus mean of ``b`` with a 95% interval, unpaired; the conservative degrees of
    freedom (min(n) - 1) that ``spade regret`` uses when pairs are missing."""
    if len(a) < 2 or len(b) < 2:
        return "n/a"
    d = mean(a) - mean(b)
    half = t975(min(len(a), len(b)) - 1) * (sample_var(a) / len(a) + sample_var(b) / len(b)) ** 0.5
    return f"{d:+.3f} ± {half:.3f} (designs {len(a)}, {len(b)})"


def correlation(xs: list[float], ys: list[float]) -> float | None:
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # fewer than two points, or one side constant
        return None


def reward_fit(iters: list[Path], table: dict, validated: list[list[dict]] | None = None) -> dict:
    """How well the Designer's paid reward tracks its design's true (probe) regret: the correlation
    over the valid designs of ``iters``, and within GRPO's groups (each design minus its group's
    mean: what the advantage sees). ``validated``: the iterations' rows, if already read."""
    groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for i, path in enumerate(iters):
        rows = validated[i] if validated is not None else load(path)
        cell = {r["env_id"]: c for r in rows if r.get("valid") and (c := cells.cell_of(r)) in table}
        for s in load(path.with_name("scores.jsonl")):
            if s["env_id"] in cell and s.get("note") is None and s.get("designer_reward") is not None:
                groups[(i, s.get("group_id"))].append((s["designer_reward"], table[cell[s["env_id"]]]["gain"]))
    pairs = [pair for g in groups.values() for pair in g]
    dx, dy = [], []
    for g in groups.values():
        if len(g) > 1:
            mx, my = mean([x for x, _ in g]), mean([y for _, y in g])
            dx += [x - mx for x, _ in g]
            dy += [y - my for _, y in g]
    return {"designs": len(pairs), "r": correlation([x for x, _ in pairs], [y for _, y in pairs]),
            "r_within": correlation(dx, dy)}


def seeds(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("seed*") if p.is_dir())


def gate(root: Path) -> dict:
    out = {}
    for sd in seeds(root):
        warm, learned = probe(sd / "probe_warm"), probe(sd / "probe_learned")
        if warm is None:
            continue
        fig = {"gate": cells.gate(warm), "frontier": cells.frontier(warm)}
        failed = [c for c, t in warm.items() if t["unhinted"] < 0.2]
        if learned:
            for name, held in (("trainable", False), ("held_out", True)):
                cs = [c for c in failed if (c in space.HELD_OUT) == held and c in learned]
                fig[f"failed_{name}"] = {
                    "cells": len(cs), "unhinted_before": mean([warm[c]["unhinted"] for c in cs]),
                    "unhinted_after": mean([learned[c]["unhinted"] for c in cs]),
                    "hinted_after": mean([learned[c]["hinted"] for c in cs])}
        out[sd.name] = fig
        print(f"\n### {sd.name}: the warm Agent's probe\n")
        print("| cell | unhinted | hinted | gain ± 95% | after learning: unhinted |")
        print("|---|---|---|---|---|")
        for c in sorted(warm):
            t = warm[c]
            after = f"{learned[c]['unhinted']:.2f}" if learned and c in learned else ""
            mark = " (held out)" if c in space.HELD_OUT else ""
            print(f"| {c[0]}/{c[1]}{mark} | {t['unhinted']:.2f} | {t['hinted']:.2f} | "
                  f"{t['gain']:+.2f} ± {t['ci95']:.2f} | {after} |")
        g = fig["gate"]
        print(f"\ngate: {g['passing']} of {g['cells']} cells gain >= {g['min_gain']} from the hint "
              f"({g['significant']} with the interval above 0)")
        for name in ("failed_trainable", "failed_held_out"):
            if name in fig:
                f = fig[name]
                print(f"{name}: {f['cells']} cells, unhinted {f['unhinted_before']} -> {f['unhinted_after']}")
    return out


def steering(root: Path, last: int, first: int | None = None) -> dict:
    per_arm: dict[str, dict[str, list]] = {}
    by_seed: dict[str, dict[str, float]] = {}
    designs: dict[str, dict[str, list[float]]] = {}  # seed -> arm -> true gain of each valid design
    for sd in seeds(root):
        table = probe(sd / "probe_warm")
        if table is None:
            continue
        for run in sorted(p for p in (sd / "steering").glob("*") if p.is_dir()):
            iters = sorted(run.glob("iter_*/validated.jsonl"))[:first]
            if not iters:
                continue
            validated = [load(p) for p in iters]  # each iteration read once, for every figure below
            rows = [cells.choices(v, table) for v in validated]
            tail = rows[-last:]
            acc = per_arm.setdefault(run.name, {"true_regret": [], "learnable_share": [], "valid_share": [],
                                                "first_true_regret": [], "iterations": [], "reward_fit": [],
                                                "level": []})
            acc["true_regret"].append(mean([r["true_regret"] for r in tail if r["true_regret"] is not None]))
            by_seed.setdefault(sd.name, {})[run.name] = acc["true_regret"][-1]
            designs.setdefault(sd.name, {})[run.name] = [
                table[c]["gain"] for v in validated[-last:] for r in v
                if r.get("valid") and (c := cells.cell_of(r)) in table]
            acc["learnable_share"].append(mean([r["learnable_share"] for r in tail
                                                if r["learnable_share"] is not None]))
            acc["valid_share"].append(mean([r["valid"] / r["designs"] for r in tail]))
            acc["first_true_regret"].append(rows[0]["true_regret"])
            acc["iterations"].append(len(rows))
            acc["level"].append(mean([r["levels"] for r in tail if r["levels"] is not None]))
            acc["reward_fit"].append({"seed": sd.name, **reward_fit(iters, table, validated)})
    print(f"\n| arm | seeds | iterations | true regret, first iteration | true regret, last {last} "
          f"| learnable share, last {last} | valid share, last {last} | mean level, last {last} |")
    print("|---|---|---|---|---|---|---|---|")
    for arm, a in sorted(per_arm.items()):
        print(f"| {arm} | {len(a['true_regret'])} | {min(a['iterations'])}-{max(a['iterations'])} | "
              f"{interval(a['first_true_regret'])} | {interval(a['true_regret'])} | "
              f"{interval(a['learnable_share'])} | {interval(a['valid_share'])} | {interval(a['level'])} |")
    print("\n| arm | seed | valid designs read | paid reward vs true regret, r "
          "| the same within a prompt's group, r |")
    print("|---|---|---|---|---|")
    for arm, a in sorted(per_arm.items()):
        for f in a["reward_fit"]:
            r, rw = (f"{x:+.2f}" if x is not None else "n/a" for x in (f["r"], f["r_within"]))
            print(f"| {arm} | {f['seed']} | {f['designs']} | {r} | {rw} |")
    # the pre-stated test: each trained arm against each control, paired by seed (shared warm start)
    pairs = [("regret", "shuffled"), ("regret", "frozen"), ("pooled", "shuffled"), ("pooled", "frozen"),
             ("pooled", "regret")]
    for arm, control in pairs:
        diffs = [d[arm] - d[control] for d in by_seed.values()
                 if d.get(arm) is not None and d.get(control) is not None]
        if any(arm in d and control in d for d in by_seed.values()):  # both ran: n/a when no figure
            per_arm.setdefault("paired", {})[f"{arm}_minus_{control}"] = diffs
            print(f"\ntrue regret, {arm} arm minus {control}, paired by seed: {interval(diffs)}")
    # one seed has no interval over seeds: the pilot's reading is over its designs
    for seed, arms in sorted(designs.items()):
        for arm, control in pairs:
            if arm in arms and control in arms:
                fig = welch(arms[arm], arms[control])
                per_arm.setdefault("designs", {}).setdefault(seed, {})[f"{arm}_minus_{control}"] = fig
                print(f"\n{seed}: true regret of the last {last} iterations' valid designs, "
                      f"{arm} minus {control}: {fig}")
    return per_arm


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["gate", "steering"])
    ap.add_argument("root", type=Path)
    ap.add_argument("--last", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=None,
                    help="steering: read only each run's first N iterations (a longer run's first part)")
    args = ap.parse_args(argv)
    if args.iterations is not None and args.iterations < 1:
        ap.error(f"--iterations: at least 1 (got {args.iterations})")
    figures = gate(args.root) if args.mode == "gate" else steering(args.root, args.last, args.iterations)
    (args.root / f"summary_{args.mode}.json").write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
