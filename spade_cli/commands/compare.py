"""`spade compare`: arms x seeds of an experiment as the paper's table (mean ± 95% CI) and curves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spade_cli.cli import PANEL_HELPERS, ConfigOpt, command, console, finish


def _show(result: dict) -> None:
    from rich.table import Table

    from stages.compare import MARK, cell

    arms = list(result["arms"])
    t = Table(title=f"{len(arms)} arms, reference {result['reference']}", title_justify="left")
    t.add_column("benchmark", overflow="fold")
    for arm in arms:
        t.add_column(f"{arm}{MARK}" if arm in result["budget_differs"] else arm, justify="right")
    by = {(r["row"], r["arm"]): r for r in result["table"]}
    for label in dict.fromkeys(r["row"] for r in result["table"]):
        t.add_row(label, *[cell(by[(label, a)]) for a in arms])
    console.print(t)
    for arm, why in result["budget_differs"].items():
        console.print(f"[bold red]{MARK} {arm}: budget differs from {result['reference']}'s; not a controlled "
                      f"comparison[/] ({why})", soft_wrap=True)
    for arm, why in result["settings_differ"].items():
        console.print(f"[bold red]{arm}: settings differ[/] ({why})", soft_wrap=True)
    for note in result["notes"]:
        console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
    for path in [result["markdown"], result["csv"], *result["plots"]]:
        console.print(f"[green]wrote[/] {path}", soft_wrap=True)


def compare(
    dirs: Annotated[list[Path], typer.Argument(help="Experiment (EXP/ARM/RUN), arm (ARM/RUN) or run dirs.",
                                               exists=True, file_okay=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Output folder. Default: DIR/compare for one DIR.", file_okay=False)] = None,
    iteration: Annotated[int | None, typer.Option(
        "--iteration", help="Compare evals at this iteration (default: latest common).", min=0)] = None,
    reference: Annotated[str | None, typer.Option(
        "--reference", help="Arm the others are differenced against and must match in budget (default: spade).")] = None,
    budget_tol: Annotated[float, typer.Option(
        "--budget-tol", help="Relative budget difference that marks an arm.", min=0)] = 0.05,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write PNG curves.")] = True,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Refuse when an arm's budget or shared settings (settings.json) differ.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Compare arms over seeds: per benchmark mean ± 95% CI (t) and each arm's paired difference
    from the reference arm seed by seed, Vendi/n, episodes and tokens.

    Writes compare.csv, compare.md and curve-BENCHMARK.png (eval metric vs iteration per arm, mean
    with CI band). An arm whose Agent episodes or tokens per iteration differ from the reference
    arm's is marked † and warned about, as is one whose shared settings (settings.json) differ;
    --strict refuses both.

    Example: [bold]spade compare runs/exp[/] (after [bold]EXP=runs/exp bash recipes/experiment.sh[/])
    """
    from stages import compare as stage

    if out is None:
        if len(dirs) != 1:
            raise typer.BadParameter("pass --out when comparing several directories", param_hint="--out")
        out = dirs[0] / "compare"
    result = stage.run(dirs, out, iteration=iteration, reference=reference, budget_tol=budget_tol, plots=plots,
                       strict=strict)
    _show(result)
    finish({k: v for k, v in result.items() if k != "table"})


def register(app: typer.Typer) -> None:
    app.command("compare", rich_help_panel=PANEL_HELPERS)(command(compare))
