"""The design space's measurements: per-cell returns, the gate, and where a Designer's choices fall.

Pure functions over rows read from the stages' files (validated rows with a ``spec``, score rows),
so every figure in docs/curriculum.md can be recomputed by hand; ``recipes/curriculum/summarize.py``
walks the experiments' run directories with them.

- ``cell_table``: per cell (rule, level) of a probe, the hinted and unhinted means, the gain (the
  hint-regret) with its 95% interval, pooled over every env of the cell in the score files given
  (a probe plays one env per cell; pooling several probes weights each by its episodes);
- ``gate``: the cells where the hint helps the Agent by at least ``min_gain``: whether regret can
  carry signal at all;
- ``choices``: where an iteration's valid designs fall against a probe: the mean true regret of the
  chosen cells (the probe's gain, not the noisy regret the Designer was paid), the share of choices
  in learnable cells (true gain >= ``learnable``) and the share of invalid designs;
- ``frontier``: per rule, the highest level the Agent still solves unhinted (>= ``solved``), and
  the highest it solves hinted: the band between them is where hint-regret is large.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from spade_cli.designer.curriculum import level_of, mean, spec_of

Cell = tuple[str, int]


def cell_of(row: dict) -> Cell | None:
    level = level_of(row)
    return None if level is None or "rule" not in (spec := spec_of(row) or {}) else (spec["rule"], level)


def cell_table(validated: Iterable[dict], scores: Iterable[dict]) -> dict[Cell, dict]:
    """``{cell: {hinted, unhinted, gain, ci95, n}}`` over the valid, scored envs of a probe."""
    cells = {r["env_id"]: c for r in validated if r.get("valid") and (c := cell_of(r))}
    acc: dict[Cell, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for s in scores:
        c = cells.get(s["env_id"])
        if c is None or s.get("hinted_mean") is None or s.get("unhinted_mean") is None:
            continue
        n = min(s.get("hinted_n") or 0, s.get("unhinted_n") or 0) or 1
        a = acc[c]
        a["h"].append((s["hinted_mean"], n))
        a["u"].append((s["unhinted_mean"], n))
        a["ci"].append((s.get("regret_ci95") or 0.0, n))
    out = {}
    for c, a in acc.items():
        n = sum(w for _, w in a["h"])
        h = sum(x * w for x, w in a["h"]) / n
        u = sum(x * w for x, w in a["u"]) / n
        # independent probes: the half-widths combine as the errors of a weighted mean
        ci = sum((x * w / n) ** 2 for x, w in a["ci"]) ** 0.5
        out[c] = {"hinted": h, "unhinted": u, "gain": h - u, "ci95": ci, "n": n}
    return out


def gate(table: dict[Cell, dict], min_gain: float = 0.2) -> dict:
    """How many cells the hint helps by ``min_gain`` (the mean) and significantly (interval above 0)."""
    passing = sorted(c for c, t in table.items() if t["gain"] >= min_gain)
    sure = sorted(c for c, t in table.items() if t["gain"] - t["ci95"] > 0)
    return {"cells": len(table), "min_gain": min_gain, "passing": len(passing),
            "passing_cells": [f"{r}/{lv}" for r, lv in passing], "significant": len(sure)}


def frontier(table: dict[Cell, dict], solved: float = 0.5) -> dict[str, dict]:
    """Per rule: the highest level solved unhinted and hinted (0: none), from the probe's means."""
    out: dict[str, dict] = {}
    for (rule, level), t in sorted(table.items()):
        f = out.setdefault(rule, {"unhinted": 0, "hinted": 0})
        if t["unhinted"] >= solved:
            f["unhinted"] = max(f["unhinted"], level)
        if t["hinted"] >= solved:
            f["hinted"] = max(f["hinted"], level)
    return out


def choices(validated: Iterable[dict], table: dict[Cell, dict], learnable: float = 0.2) -> dict:
    """Where one iteration's designs fall on the probe (see the module docstring)."""
    rows = list(validated)
    chosen = [c for r in rows if r.get("valid") and (c := cell_of(r)) in table]
    gains = [table[c]["gain"] for c in chosen]
    return {"designs": len(rows), "valid": sum(bool(r.get("valid")) for r in rows),
            "on_probe": len(chosen), "true_regret": mean(gains),
            "learnable_share": (sum(g >= learnable for g in gains) / len(gains)) if gains else None,
            "distinct_cells": len(set(chosen)),
            "levels": mean([lv for _, lv in chosen])}


def best_possible(table: dict[Cell, dict], exclude: Iterable[Cell] = ()) -> float | None:
    """The highest true regret a Designer could choose (the ceiling of ``choices``' true_regret)."""
    skip = set(exclude)
    gains = [t["gain"] for c, t in table.items() if c not in skip]
    return max(gains) if gains else None
