"""The curriculum diagnostics of `spade report`: where each iteration's designs fall against the Agent.

``spade_cli.reporting.iterations`` calls these per iteration; formulas and an example in docs/report.md ("Curriculum
diagnostics"). From the iteration's artifacts:

- **Label shares** (``scores.jsonl``): each valid design is labelled as the Designer's memory
  summary labels an env (``spade_cli.designer.prompts``: too easy = unhinted mean >= 0.8, too hard
  = hinted mean <= 0.2, learnable = regret >= 0.2, else no signal; untested without episodes), and
  each label's share of the iteration's valid designs is a column (``share_too_easy``, ...).
- **Regret quantiles** (``scores.jsonl``): the 10/25/50/75/90 % quantiles of the valid designs'
  regret (``regret_p10`` ... ``regret_p90``, linear interpolation) and ``share_ci_above_0``, the
  share of them whose 95 % interval lies above 0 (``regret - regret_ci95 > 0``; a design without
  an interval, fewer than two pairs, does not count as above). With k = 8 pairs the interval is
  about +-0.3, so this share says how much of the regret signal is more than noise.
- **Levels against the frontier** (only for designs with a structured ``spec``: a mapping whose
  int ``level`` is the difficulty knob, higher = harder): ``levels`` (how many valid designs chose
  each level) and ``level_mean``; ``unhinted_by_level``, the unhinted mean return per level over
  every env the iteration played (designs, replays, fixed sets; an env's level comes from the env
  files its rollout manifest names, which must still exist where the rollout read them, and from
  the iteration's ``validated.jsonl`` and the replay file it played); and ``frontier``, the highest
  level whose unhinted mean is still >= 0.5 (empty when none is). A run without specs has none of
  these columns.

**The Designer on a fixed prompt set** (``RUN/designer_probe/iter_i/``, written by
recipes/designer_probe.sh): checkpoint i's designs for the same prompts in every checkpoint, played
by one fixed Agent, read as an iteration's own designs are and prefixed ``probe_``
(``probe_valid_rate``, ``probe_regret_mean``, ``probe_share_learnable``, ...). The loop's own
figures mix three changes, the Designer, its prompts (the memory grows) and the Agent that plays;
these hold the last two fixed.

Plots: ``labels.png`` (stacked shares), ``regret.png`` (quantile bands and the share above 0),
``frontier.png`` (the chosen levels, their mean and the frontier) and ``designer_probe.png`` (the
fixed prompt set's validity, regret and learnable share per checkpoint), each only when it has data.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spade_cli.core.artifacts import manifest_path, read_rows
from spade_cli.core.layout import RunLayout
from spade_cli.core.records import Score, Validation
from spade_cli.designer.curriculum import level_of, quantile
from spade_cli.designer.prompts import label

LABELS = {"too easy": "share_too_easy", "learnable": "share_learnable", "too hard": "share_too_hard",
          "no signal": "share_no_signal", "untested": "share_untested"}
QUANTILES = (10, 25, 50, 75, 90)
FRONTIER_MEAN = 0.5  # the Agent "solves" a level when its unhinted mean there reaches this
COLUMNS = [*LABELS.values(), *(f"regret_p{q}" for q in QUANTILES), "share_ci_above_0", "levels", "level_mean",
           "unhinted_by_level", "frontier"]
# the figures the fixed prompt set's files give, by file: the same readers as an iteration's own
PROBE = {"validated": ("valid_rate", "level_mean"),
         "scores": ("regret_mean", "designer_reward_mean", "share_learnable", "share_too_easy", "share_too_hard",
                    "share_ci_above_0", "vendi_per_n")}
PROBE_COLUMNS = [f"probe_{k}" for keys in PROBE.values() for k in keys]


class DesignScores:
    """The label shares and regret quantiles of one iteration's valid designs, row by row."""

    def __init__(self) -> None:
        self.labels: Counter[str] = Counter()
        self.regrets: list[float] = []
        self.above = 0

    def add(self, rec: Score) -> None:
        if rec.extra.get("valid") is False:  # an invalid design has no figures to label
            return
        self.labels[label(rec.unhinted_mean, rec.hinted_mean, rec.regret)] += 1
        if rec.regret is not None:
            self.regrets.append(rec.regret)
            self.above += rec.regret_ci95 is not None and rec.regret - rec.regret_ci95 > 0

    def result(self) -> dict:
        n = sum(self.labels.values())
        if not n:
            return {}
        out: dict[str, Any] = {col: self.labels[lab] / n for lab, col in LABELS.items()}
        if self.regrets:
            vals = sorted(self.regrets)
            out.update({f"regret_p{q}": quantile(vals, q / 100) for q in QUANTILES})
            out["share_ci_above_0"] = self.above / len(vals)
        return out


def chosen_levels(levels: list[int]) -> dict:
    """``levels`` (count per level, lowest first; keys as text, as JSON keeps them) and ``level_mean``."""
    if not levels:
        return {}
    return {"levels": {str(lv): c for lv, c in sorted(Counter(levels).items())},
            "level_mean": sum(levels) / len(levels)}


def env_files(layout: RunLayout, i: int, rollouts: list[Path]) -> list[Path]:
    """The env files iteration ``i`` played that still exist: its validated file, the replay file
    of iteration i-1, and every ``--envs`` file its rollout manifests name (a fixed set)."""
    found = [layout.validated(i), *([layout.replay(i - 1)] if i > 0 else [])]
    for path in rollouts:
        try:
            manifest = json.loads(manifest_path(path).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        inputs = manifest.get("inputs") if isinstance(manifest, dict) else None
        for fp in (inputs or {}).get("envs") or []:
            if isinstance(fp, dict) and isinstance(fp.get("path"), str):
                found.append(Path(fp["path"]))
    out, seen = [], set()
    for p in found:
        if p.is_file() and p.resolve() not in seen:
            seen.add(p.resolve())
            out.append(p)
    return out


def frontier(unhinted: dict[str, list], files: list[Path]) -> dict:
    """``unhinted_by_level`` and ``frontier`` from each played env's unhinted ``[sum, n]``; {} when
    no played env has a level."""
    if not unhinted:
        return {}
    levels: dict[str, int] = {}
    for _, _, rec in read_rows(files, expect="spade.validation"):
        assert isinstance(rec, Validation)
        if (lv := level_of(rec)) is not None:
            levels.setdefault(rec.env_id, lv)
    per: dict[int, list] = {}
    for env_id, (total, n) in unhinted.items():
        if env_id in levels and n:
            acc = per.setdefault(levels[env_id], [0.0, 0])
            acc[0] += total
            acc[1] += n
    if not per:
        return {}
    means = {lv: total / n for lv, (total, n) in sorted(per.items())}
    solved = [lv for lv, m in means.items() if m >= FRONTIER_MEAN]
    return {"unhinted_by_level": {str(lv): m for lv, m in means.items()}, "frontier": max(solved) if solved else None}


# -- plots -------------------------------------------------------------------------------------

def _has(rows: list[dict], key: str) -> list[dict]:
    return [r for r in rows if isinstance(r.get(key), int | float)]


def write_plots(rows: list[dict], out_dir: Path, plt: Any, save: Callable[[Any, Path], Path]) -> list[Path]:
    """labels.png, regret.png and frontier.png, each when some iteration has its figures."""
    from matplotlib.ticker import MaxNLocator

    written = []
    shares = _has(rows, "share_no_signal")
    if shares:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        its, bottom = [r["iteration"] for r in shares], [0.0] * len(shares)
        for lab, col in LABELS.items():
            vals = [r[col] for r in shares]
            if any(vals):
                ax.bar(its, vals, bottom=bottom, label=lab)
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_ylabel("share of valid designs")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
        written.append(_finish(fig, ax, "design labels", out_dir / "labels.png", plt, save, MaxNLocator))
    qs = _has(rows, "regret_p50")
    if qs:
        fig, (ax, low) = plt.subplots(2, 1, figsize=(7, 4.8), sharex=True)
        its = [r["iteration"] for r in qs]
        ax.fill_between(its, [r["regret_p10"] for r in qs], [r["regret_p90"] for r in qs], alpha=0.15,
                        label="10-90 %")
        ax.fill_between(its, [r["regret_p25"] for r in qs], [r["regret_p75"] for r in qs], alpha=0.3,
                        label="25-75 %")
        ax.plot(its, [r["regret_p50"] for r in qs], marker="o", markersize=3, label="median")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_ylabel("regret")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        low.plot(its, [r["share_ci_above_0"] for r in qs], marker="o", markersize=3)
        low.set_ylabel("CI above 0")
        low.set_ylim(0, 1)
        written.append(_finish(fig, low, "regret of valid designs", out_dir / "regret.png", plt, save, MaxNLocator))
    chosen = [r for r in rows if r.get("levels") or r.get("unhinted_by_level")]
    if chosen:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        pts = [(r["iteration"], int(lv), c) for r in chosen for lv, c in (r.get("levels") or {}).items()]
        if pts:
            # rings sized by how many designs chose the level, over the lines so none is hidden
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=[40 * p[2] for p in pts], facecolors="none",
                       edgecolors="grey", zorder=3, label="chosen levels")
        for key, name, style in (("level_mean", "chosen mean", "o-"), ("frontier", "frontier", "D--")):
            ax.plot([r["iteration"] for r in chosen],
                    [r[key] if isinstance(r.get(key), int | float) else float("nan") for r in chosen],
                    style, markersize=4, label=name)
        ax.set_ylabel("level")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
        written.append(_finish(fig, ax, "difficulty against the Agent's frontier", out_dir / "frontier.png", plt,
                               save, MaxNLocator))
    return written


def _finish(fig: Any, ax: Any, title: str, path: Path, plt: Any, save: Callable[[Any, Path], Path],
            locator: Any) -> Path:
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(locator(integer=True))
    ax.grid(alpha=0.3)
    fig.suptitle(title)
    out = save(fig, path)
    plt.close(fig)
    return out
