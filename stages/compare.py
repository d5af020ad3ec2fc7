"""`spade compare`: the paper's table of an experiment, arms by benchmarks, mean ± 95% CI over seeds.

Inputs: directories, each one of
- an experiment, ``EXP/ARM/RUN/`` (what ``recipes/experiment.sh`` writes: ``EXP/spade/seed_0/``);
- an arm, ``ARM/RUN/``: every run directory inside is one seed of the arm named after the folder;
- a run directory (``runs/NAME``): one seed of an arm named NAME.

Every run is read through ``spade_cli.reporting.iterations`` (``iterations`` and ``iteration_row``, with the run's
own report cache), so a figure means here what it means in ``spade report``. Per run and
benchmark (an ``eval:<task>/<metric>`` column) the value is taken at one iteration, the same for
every run: the latest iteration at which every run of the comparison has that benchmark (a
benchmark no iteration has in common is taken at each run's latest and the row says so). Per run,
Vendi/n, Agent episodes and Agent tokens are averaged over the iterations that have them.

Across the seeds of an arm a cell is ``mean ± h`` with h the half-width of a 95% confidence interval
from the t-distribution with n-1 degrees of freedom; an arm with one seed has no interval and the
cell says ``n=1``. The comparison is only fair at equal budgets (fixed pools are dealt to
``--n`` environments, ``spade_cli.envs.pool``), so the episodes and tokens per iteration are rows of
the table, and an arm whose Agent episodes or tokens per iteration differ from the reference
arm's (``spade`` when present, else the first) by more than ``budget_tol`` is marked ``†``, with a
bold warning at the top of the markdown. Each run's ``settings.json`` (written by
``recipes/experiment.sh``) is read too: an arm whose shared settings (model, corpus, sampling,
budgets: all but the arm knobs and the seed) differ from the reference's, or a run without the
file, gets a warning of its own. ``strict`` refuses either case instead.

Beside each benchmark's row, a row ``BENCH: Δ vs REF (paired by seed)`` holds, per arm, that arm's
value minus the reference arm's on the same seed, mean ± 95% CI over the seeds both arms ran. Runs
are matched by the ``SEED`` of their ``settings.json``, else by their folder name (``seed_0``). An
experiment's arms share the starting model and their evaluation seeds per loop seed, so the paired
interval is the one a claim "arm A beats arm B" is judged by: the columns' own intervals also hold
the seed-to-seed variation the two arms share.

Output, in ``out_dir``: ``compare.csv`` (one row per table row and arm, with the per-seed values),
``compare.md`` (the table), and ``curve-<benchmark>.png`` per benchmark (mean over seeds per
iteration, with the CI band where two or more seeds have the point).

    spade compare runs/exp --out runs/exp/compare
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from spade_cli.core.artifacts import SpadeError, atomic_write_text
from spade_cli.core.layout import RunLayout
from spade_cli.reporting import iterations as report

BUDGET_ROWS = [("episodes", "Agent episodes / iteration"), ("agent_tokens", "Agent tokens / iteration")]
MARK = "†"
# The knobs that define an arm (recipes/experiment.sh) and the seed: allowed to differ between runs.
ARM_KNOBS = frozenset({"POOL", "FROZEN_DESIGNER", "SIGNAL", "GROUNDING", "MEMORY", "SEED"})
SETTINGS = "settings.json"  # what recipes/experiment.sh stores per run (`spade plan --print-settings`)


def _is_run(path: Path) -> bool:
    return path.is_dir() and bool(report.iterations(RunLayout(path)))


def discover(dirs: list[Path]) -> dict[str, list[Path]]:
    """``{arm: [run dirs]}`` from experiment, arm and run directories, in the order given."""
    arms: dict[str, list[Path]] = {}

    def add(arm: str, run: Path) -> None:
        runs = arms.setdefault(arm, [])
        if any(r.name == run.name for r in runs):
            raise SpadeError(f"arm {arm!r} has two runs named {run.name} ({runs[0].parent} and {run.parent})")
        runs.append(run)

    for d in map(Path, dirs):
        if not d.is_dir():
            raise SpadeError(f"{d}: not a directory")
        if _is_run(d):
            add(d.name, d)
            continue
        children = sorted(p for p in d.iterdir() if p.is_dir())
        runs = [p for p in children if _is_run(p)]
        if runs:  # an arm
            for r in runs:
                add(d.name, r)
            continue
        found = False
        for arm in children:  # an experiment
            for r in sorted(p for p in arm.iterdir() if _is_run(p)):
                add(arm.name, r)
                found = True
        if not found:
            raise SpadeError(f"{d}: no run directories in it, nor in its sub-folders (ARM/RUN)")
    return arms


def run_summary(run: Path) -> dict:
    """One run: its eval values by benchmark and iteration, and its per-iteration means."""
    layout = RunLayout(run)
    rows = [report.iteration_row(layout, i, layout.report_dir / ".cache") for i in report.iterations(layout)]
    evals: dict[str, dict[int, float]] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("eval:") and isinstance(v, int | float):
                evals.setdefault(k.removeprefix("eval:"), {})[r["iteration"]] = float(v)
    settings = _settings(run)
    out: dict[str, Any] = {"run": str(run), "evals": evals,
                           "iterations": sum(1 for r in rows if "episodes" in r), "settings": settings,
                           "seed": _seed_key(run, settings)}
    for key in ("vendi_per_n", "episodes", "agent_tokens"):
        vals = [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
        out[key] = sum(vals) / len(vals) if vals else None
    return out


def _settings(run: Path) -> dict | None:
    path = run / SETTINGS
    if not path.is_file():
        return None
    import json

    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise SpadeError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SpadeError(f"{path}: not a JSON object of settings")
    return data


def _seed_key(run: Path, settings: dict | None) -> str:
    """What matches a run with its partners in the other arms: its SEED setting, else its folder."""
    seed = (settings or {}).get("SEED")
    return f"SEED={seed}" if seed not in (None, "") else run.name


def paired(bench: str, at: dict[str, dict[str, float]], ref: str, notes: list[str], skip: set[str],
           iteration: int | str) -> list[dict]:
    """The rows ``BENCH: Δ vs REF``: per arm, its value minus the reference's on each shared seed.
    ``at``: per arm, seed key -> the value compared in the benchmark's own row; arms in ``skip``
    (or all, when the reference is in it) have an empty cell."""
    label = f"{bench}: Δ vs {ref} (paired by seed)"
    empty = {"kind": "paired", "row": label, "n": 0, "mean": None, "ci95": None, "values": [], "seeds": [],
             "iteration": iteration, "start": None}
    rows = [{**empty, "arm": ref}]
    for arm in at:
        if arm == ref:
            continue
        if ref in skip or arm in skip:
            rows.append({**empty, "arm": arm})
            continue
        seeds = [k for k in at[arm] if k in at[ref]]
        unmatched = sorted(set(at[arm]) ^ set(at[ref]))
        if unmatched:
            notes.append(f"{bench}: {arm} vs {ref}: seeds without a partner left out of the paired row: "
                         + ", ".join(unmatched))
        diffs = [at[arm][k] - at[ref][k] for k in seeds]
        mean, ci = mean_ci(diffs)
        rows.append({**empty, "arm": arm, "n": len(diffs), "mean": mean, "ci95": ci, "values": diffs,
                     "seeds": seeds})
    return rows


def settings_differ(arms: dict[str, list[dict]], ref: str) -> dict[str, str]:
    """Per arm, the shared settings (all but the arm knobs and the seed) in which one of its runs
    differs from the reference arm's first run with a settings file, and its runs without one;
    empty when no run has the file (runs not made by recipes/experiment.sh; ``settings_checked``
    in the result says so)."""
    base = next((r["settings"] for runs in (arms[ref], *arms.values()) for r in runs if r["settings"]), None)
    if base is None:
        return {}
    out: dict[str, str] = {}
    for arm, runs in arms.items():
        diffs: list[str] = []
        for r in runs:
            name, got = Path(r["run"]).name, r["settings"]
            if got is None:
                diffs.append(f"{name}: no {SETTINGS}")
                continue
            diffs += [f"{name}: {key} {got.get(key)!r} vs {base.get(key)!r}"
                      for key in sorted((base.keys() | got.keys()) - ARM_KNOBS) if base.get(key) != got.get(key)]
        if diffs:
            out[arm] = "; ".join(diffs)
    return out


def mean_ci(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and the half-width of its 95% t-interval (None for fewer than two values)."""
    if not values:
        return None, None
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    from scipy.stats import t

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def _at(runs: list[dict], bench: str, iteration: int | None) -> tuple[int | None, bool]:
    """The iteration a benchmark is compared at, and whether every run has it."""
    have = [set(r["evals"].get(bench, {})) for r in runs]
    if iteration is not None:
        return iteration, all(iteration in h for h in have)
    common = set.intersection(*have) if have else set()
    return (max(common), True) if common else (None, False)


def build(arms: dict[str, list[dict]], iteration: int | None = None, reference: str | None = None,
          budget_tol: float = 0.05) -> dict:
    """The table as rows ``{kind, row, arm, n, mean, ci95, values, iteration}`` plus the budget marks."""
    everyone = [r for runs in arms.values() for r in runs]
    benches = sorted({b for r in everyone for b in r["evals"]})
    rows: list[dict] = []
    notes: list[str] = []
    ref = reference or ("spade" if "spade" in arms else next(iter(arms)))
    if ref not in arms:
        raise SpadeError(f"reference arm {ref!r} is not among the arms: {', '.join(arms)}")
    ambiguous = {arm for arm, runs in arms.items() if len({r["seed"] for r in runs}) < len(runs)}
    for arm in sorted(ambiguous):
        notes.append(f"{arm}: two of its runs have the same seed, so it has no paired rows "
                     "(compare one experiment's arms, or runs whose seeds differ)")
    for bench in benches:
        at, common = _at(everyone, bench, iteration)
        if not common and iteration is not None:
            notes.append(f"{bench}: not every run has an eval at iteration {iteration}; those runs are left out")
        elif not common:
            notes.append(f"{bench}: no iteration that every run evaluated; each run's latest eval is used")
        fixed = at if common or iteration is not None else None  # else each run's latest
        by_seed: dict[str, dict[str, float]] = {}
        for arm, runs in arms.items():
            vals, its, seeds = [], [], []
            for r in runs:
                series = r["evals"].get(bench, {})
                i = fixed if fixed is not None else (max(series) if series else None)
                if i is not None and i in series:
                    vals.append(series[i])
                    its.append(i)
                    seeds.append(r["seed"])
            by_seed[arm] = dict(zip(seeds, vals, strict=True))
            mean, ci = mean_ci(vals)
            start = [r["evals"][bench][0] for r in runs if 0 in r["evals"].get(bench, {})]
            rows.append({"kind": "eval", "row": bench, "arm": arm, "n": len(vals), "mean": mean, "ci95": ci,
                         "values": vals, "seeds": seeds,
                         "iteration": its[0] if len(set(its)) == 1 else ",".join(map(str, its)),
                         "start": sum(start) / len(start) if start else None})
        if len(arms) > 1:
            rows += paired(bench, by_seed, ref, notes, skip=ambiguous, iteration="latest" if fixed is None else fixed)
    for key, label in [("vendi_per_n", "Vendi / n"), *BUDGET_ROWS]:
        for arm, runs in arms.items():
            vals = [r[key] for r in runs if r[key] is not None]
            mean, ci = mean_ci(vals)
            rows.append({"kind": "budget" if key != "vendi_per_n" else "diversity", "row": label, "arm": arm,
                         "n": len(vals), "mean": mean, "ci95": ci, "values": vals, "iteration": "", "start": None})
    order = [ref, *(a for a in arms if a != ref)]  # the reference is the table's first column
    marked: dict[str, str] = {}
    by = {(r["row"], r["arm"]): r["mean"] for r in rows}
    for arm in arms:
        diffs = []
        for _, label in BUDGET_ROWS:
            a, b = by.get((label, arm)), by.get((label, ref))
            if a is None or b is None:
                if a != b:
                    diffs.append(f"{label.lower()}: {_num(a)} vs {_num(b)}")
            elif abs(a - b) > budget_tol * max(abs(b), 1e-12):
                diffs.append(f"{label.lower()}: {_num(a)} vs {_num(b)}")
        if arm != ref and diffs:
            marked[arm] = "; ".join(diffs)
    return {"rows": rows, "benchmarks": benches, "arms": order, "reference": ref,
            "budget_differs": marked, "settings_differ": settings_differ(arms, ref),
            "settings_checked": any(r["settings"] for r in everyone), "notes": notes, "budget_tol": budget_tol}


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3f}"


def cell(row: dict) -> str:
    if row["mean"] is None:
        return "-"
    if row["ci95"] is None:
        return f"{_num(row['mean'])} (n=1, no CI)" if row["n"] == 1 else _num(row["mean"])
    return f"{_num(row['mean'])} ± {_num(row['ci95'])}"


def to_markdown(table: dict) -> str:
    arms, ref = table["arms"], table["reference"]
    heads = [f"{a}{MARK}" if a in table["budget_differs"] else a for a in arms]
    by = {(r["row"], r["arm"]): r for r in table["rows"]}
    labels = list(dict.fromkeys(r["row"] for r in table["rows"]))
    out = [f"**UNEQUAL BUDGETS: {MARK} {arm} against {ref} ({why}); its column is not a controlled "
           "comparison.**\n" for arm, why in table["budget_differs"].items()]
    out += [f"**SETTINGS DIFFER: {arm} ({why}).**\n" for arm, why in table.get("settings_differ", {}).items()]
    out += ["| benchmark | iteration | start (iter 0) | " + " | ".join(heads) + " |",
           "|---|---|---|" + "---|" * len(arms)]
    for label in labels:
        first = by[(label, arms[0])]
        if first["kind"] == "paired":
            it, start = str(first["iteration"]), ""
        elif first["kind"] == "eval":
            its = {str(by[(label, a)]["iteration"]) for a in arms}
            starts = [by[(label, a)]["start"] for a in arms if by[(label, a)]["start"] is not None]
            start = _num(sum(starts) / len(starts)) if starts else "-"
            it = its.pop() if len(its) == 1 else "differs"
        else:
            it, start = "mean over iterations", ""
        out.append(f"| {label} | {it} | {start} | " + " | ".join(cell(by[(label, a)]) for a in arms) + " |")
    seeds = [max(r["n"] for r in table["rows"] if r["arm"] == a) if table["rows"] else 0 for a in arms]
    out.append("| seeds | | | " + " | ".join(map(str, seeds)) + " |")
    out += ["", "Cells: mean ± half-width of the 95% confidence interval over seeds (t-distribution, n-1 "
            "degrees of freedom); `n=1, no CI` where an arm has a single seed. The start column is the "
            "starting model (eval/iter_0000), the same checkpoint in every arm. A `Δ vs` row: each arm's value "
            f"minus {ref}'s on the same seed, mean ± 95% CI over the seeds both ran (the interval that "
            "judges a difference between arms)."]
    for arm, why in table["budget_differs"].items():
        out.append(f"\n{MARK} {arm}: budget differs from {ref}'s by more than {100 * table['budget_tol']:.0f}% "
                   f"({why}).")
    out += [f"\nNote: {n}." for n in table["notes"]]
    return "\n".join(out) + "\n"


def to_csv(table: dict) -> str:
    rows = [{**r, "values": ";".join(_num(v) for v in r["values"]), "seeds": ";".join(r.get("seeds", [])),
             "budget_differs": r["arm"] in table["budget_differs"]} for r in table["rows"]]
    return report.to_csv(rows, ["kind", "row", "arm", "n", "mean", "ci95", "values", "seeds", "iteration", "start",
                                "budget_differs"])


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "benchmark"


def write_curves(arms: dict[str, list[dict]], benches: list[str], out_dir: Path) -> list[Path]:
    """One PNG per benchmark: each arm's mean over seeds per iteration, with its 95% CI band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    for bench in benches:
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for arm, runs in arms.items():
            its = sorted({i for r in runs for i in r["evals"].get(bench, {})})
            if not its:
                continue
            stats = [mean_ci([r["evals"][bench][i] for r in runs if i in r["evals"].get(bench, {})]) for i in its]
            means = [m for m, _ in stats]
            line, = ax.plot(its, means, marker="o", markersize=3, label=f"{arm} (n={len(runs)})")
            lo = [m - (c or 0.0) for m, c in stats]
            hi = [m + (c or 0.0) for m, c in stats]
            if any(c is not None for _, c in stats):
                ax.fill_between(its, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel("iteration")
        ax.set_ylabel(bench)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.suptitle(f"{bench}: mean over seeds, 95% CI band")
        written.append(report.save_figure(fig, out_dir / f"curve-{slug(bench)}.png"))
        plt.close(fig)
    return written


def run(dirs: list[str | Path], out_dir: str | Path, *, iteration: int | None = None, reference: str | None = None,
        budget_tol: float = 0.05, plots: bool = True, strict: bool = False) -> dict:
    """Read the runs of ``dirs``, write the table (CSV, markdown) and the curves; returns the summary.
    ``strict``: refuse, writing nothing, when an arm's budget or shared settings differ."""
    arm_dirs = discover([Path(d) for d in dirs])
    arms = {arm: [run_summary(r) for r in runs] for arm, runs in arm_dirs.items()}
    table = build(arms, iteration=iteration, reference=reference, budget_tol=budget_tol)
    if strict and (table["budget_differs"] or table["settings_differ"]):
        why = [f"{a}: budget differs from {table['reference']}'s ({w})" for a, w in table["budget_differs"].items()]
        why += [f"{a}: settings differ ({w})" for a, w in table["settings_differ"].items()]
        raise SpadeError("--strict: not a controlled comparison:\n  " + "\n  ".join(why))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "compare.csv", to_csv(table))
    atomic_write_text(out / "compare.md", to_markdown(table))
    written = write_curves({a: arms[a] for a in table["arms"]}, table["benchmarks"], out) if plots else []
    return {"status": "ok", "out_dir": str(out), "csv": str(out / "compare.csv"), "markdown": str(out / "compare.md"),
            "plots": [str(p) for p in written], "arms": {a: [str(r) for r in arm_dirs[a]] for a in table["arms"]},
            "benchmarks": table["benchmarks"], "reference": table["reference"],
            "budget_differs": table["budget_differs"], "settings_differ": table["settings_differ"],
            "settings_checked": table["settings_checked"], "notes": table["notes"], "table": table["rows"]}
