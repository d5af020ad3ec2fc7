"""`spade report`: per-iteration tables and PNG plots of a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from spade_cli.cli import PANEL_HELPERS, command, console, finish

# What the terminal table shows; the CSV has every column.
SHOWN = [("iteration", "iter"), ("valid", "valid"), ("valid_rate", "valid%"), ("invalid_reasons", "top reason"),
         ("unhinted_mean", "unhinted"), ("hinted_mean", "hinted"), ("regret_mean", "regret"),
         ("vendi_per_n", "Vendi/n"), ("share_learnable", "learn%"), ("share_ci_above_0", "CI>0%"),
         ("frontier", "frontier"), ("update.loss", "loss"), ("update.kl", "kl"),
         ("update.staleness.behind", "behind")]  # updates between the sampler and the trained model


def _fmt(key: str, value: Any) -> str:
    if value is None or value == {}:
        return "-"
    if key == "invalid_reasons":
        reason, count = next(iter(value.items()))
        return f"{reason} ({count})"
    if key == "valid_rate" or key.startswith("share_"):
        return f"{100 * value:.0f}%"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-3 and value != 0 else f"{value:.3f}"
    return str(value)


def _show(result: dict, max_rows: int) -> None:
    from rich.table import Table

    rows = result["rows"]
    evals = [c for c in result["columns"] if c.startswith("eval:")][:3]
    shown = [(k, label) for k, label in SHOWN if k in result["columns"]] + [(c, c[5:]) for c in evals]
    t = Table(title=f"{result['run_dir']}: {len(rows)} iterations", title_justify="left")
    for _, label in shown:
        t.add_column(label, justify="left" if label == "top reason" else "right", overflow="fold")
    if len(rows) > max_rows:  # long runs: the first iterations, then the most recent ones
        head = max_rows // 4
        rows = rows[:head] + [None] + rows[-(max_rows - head):]
    for row in rows:
        if row is None:
            t.add_row(*["…"] * len(shown))
        else:
            t.add_row(*[_fmt(k, row.get(k)) for k, _ in shown])
    console.print(t)
    for path in result["plots"]:
        console.print(f"[green]plot[/] {path}", soft_wrap=True)


def report(
    run_dir: Annotated[Path, typer.Argument(help="The run directory (runs/NAME).", exists=True, file_okay=False)],
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write PNG plots.")] = True,
    max_rows: Annotated[int, typer.Option("--max-rows", min=4, help="Terminal table rows (CSV has all).")] = 40,
) -> None:
    """Tabulate a run per iteration: validity, returns, regret, Vendi/n, the curriculum diagnostics
    (design labels, regret quantiles, difficulty against the frontier), update metrics, eval scores.

    Writes RUN_DIR/report/iterations.csv, iterations.jsonl and PNG plots (returns, validity,
    diversity, update, eval, labels, regret, frontier); works on runs that are still going or
    stopped part-way.

    Example: [bold]spade report runs/demo[/]
    """
    from stages import report as stage

    result = stage.run(run_dir, plots=plots)
    _show(result, max_rows)
    finish({k: v for k, v in result.items() if k not in ("rows", "columns")} | {"latest": result["rows"][-1]})


def register(app: typer.Typer) -> None:
    app.command("report", rich_help_panel=PANEL_HELPERS)(command(report))
