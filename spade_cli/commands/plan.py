"""`spade plan`: the loop's schedule and settings, for the recipes that run it (``spade_cli.core.schedule``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from spade_cli.cli import PANEL_HELPERS, command


def _shell(plan: dict, prefix: str) -> str:
    """NAME=VALUE and NAME=(ARGV...) lines, shell-quoted, for `eval` in a recipe."""
    import shlex

    lines = []
    for key, value in plan.items():
        if isinstance(value, list):
            lines.append(f"{prefix}{key}=({' '.join(map(shlex.quote, value))})")
        else:
            lines.append(f"{prefix}{key}={shlex.quote(str(value))}")
    return "\n".join(lines)


def plan(
    iteration: Annotated[int | None, typer.Option("--iteration", "-i", min=0, help=(
        "The iteration whose stage calls to give."))] = None,
    start: Annotated[bool, typer.Option("--start", help=(
        "Record the run directory's loop mode (refusing the other one) and give the loop's range, "
        "banner and last calls."))] = False,
    lanes: Annotated[bool, typer.Option("--lanes", help=(
        "With --start: the pipelined loop on one machine; check its lanes' devices (ENGINE=serve).")) ] = False,
    shard: Annotated[str | None, typer.Option("--shard", help=(
        "S/N: the rollout of task S of an N-task array (its --shard and its own --out); regret and "
        "update read every shard."))] = None,
    print_settings: Annotated[bool, typer.Option("--print-settings", help=(
        "Print the settings an experiment cell records (its settings.json) and exit."))] = False,
    settings: Annotated[list[Path] | None, typer.Option("--settings", help=(
        "A settings file (TOML); repeatable, later ones win (default: $CONFIG, ':'-separated).")) ] = None,
    arms: Annotated[str | None, typer.Option("--arms", help=(
        "An experiment's arms (space-separated): print its cells, 'CELL ARM SEED RUN RECIPE' a line, "
        "and exit (recipes/experiment.sh)."), rich_help_panel="Experiment cells")] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="With --arms: the seeds.",
                                       rich_help_panel="Experiment cells")] = "0 1 2",
    exp: Annotated[str, typer.Option("--exp", help="With --arms: the experiment directory.",
                                     rich_help_panel="Experiment cells")] = "runs/exp",
    cell: Annotated[str, typer.Option("--cell", help="With --arms: only this cell (0-based).",
                                      rich_help_panel="Experiment cells")] = "",
    recipes: Annotated[Path, typer.Option("--recipes", help="With --arms: the recipes directory.",
                                          rich_help_panel="Experiment cells")] = Path("recipes"),
    shell: Annotated[bool, typer.Option("--shell", help="Print NAME=VALUE and NAME=(ARGV ...) lines for `eval`.")
                     ] = False,
    prefix: Annotated[str, typer.Option("--prefix", help="With --shell: put this before every name.")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (the default without --shell).")
                       ] = False,
) -> None:
    """Give the commands of one iteration of the loop, as the run's settings and files have it.

    The settings: the defaults, then the settings file(s), then environment variables of the same
    names in upper case (MODEL, RUN, ITERS, N_ENVS, ..., DESIGN_ARGS; docs/cli.md). Every
    stage call comes as a complete argv, empty when there is nothing to run: which checkpoint
    samples, eval points, staleness, replay, retention and the server are decided here, once.
    Example: [bold]MODEL=ckpt/tiny RUN=runs/demo spade plan -i 0 --json[/]; in a recipe
    [bold]eval "$(MODEL=ckpt/tiny RUN=runs/demo spade plan -i 0 --shell)"[/] sets $design, $rollout, ...
    """
    import os

    from spade_cli.core import run_settings, schedule
    from spade_cli.core.errors import UsageError
    from spade_cli.core.layout import RunLayout, parse_shard

    if arms is not None:
        for row in run_settings.cells(arms.split(), seeds.split(), exp, recipes, cell, os.environ):
            print(*row)
        return
    s = run_settings.resolve(os.environ, settings or None)
    if print_settings:
        print(json.dumps(run_settings.recorded(s), indent=1))
        return
    run_settings.model_of(s)
    try:
        shard_t = parse_shard(shard) if shard else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--shard") from None
    layout = RunLayout(Path(s["run"]))
    if start:
        if lanes:
            schedule.check_lanes(s, schedule.gpu_ids(os.environ))
        out = schedule.start(s, layout)
    elif iteration is None:
        raise UsageError("pass --iteration I, --start or --print-settings")
    else:
        out = schedule.iteration(s, layout, iteration, shard=shard_t)
    if shell and as_json:
        raise UsageError("--shell or --json, not both")
    print(_shell(out, prefix) if shell else json.dumps(out, indent=1))


def register(app: typer.Typer) -> None:
    app.command("plan", rich_help_panel=PANEL_HELPERS)(command(plan))
