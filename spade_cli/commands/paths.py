"""`spade paths`: the run-directory layout, for recipes that must not spell paths themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spade_cli.cli import PANEL_HELPERS, command, emit


def paths(
    run_dir: Annotated[Path, typer.Argument(help="The run directory (runs/NAME).")],
    iteration: Annotated[int, typer.Option("--iteration", "-i", help="Iteration number.")] = 0,
    shard: Annotated[str | None, typer.Option(
        "--shard", help="S/N: add rollout_shard (task S's shard of an N-task array) and rollout_shards_glob.")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Print only this path, as plain text.")] = None,
    shell: Annotated[bool, typer.Option(
        "--shell", help="Print KEY=VALUE lines, shell-quoted, for `eval` in a recipe.")] = False,
) -> None:
    """Print the artifact paths of one iteration of a run as one JSON object.

    Example: [bold]spade paths runs/demo -i 3 --key validated[/]; in a recipe
    [bold]eval "$(spade paths runs/demo -i 3 --shell)"[/] sets $designs, $memory, $next_ckpt, ...;
    [bold]spade paths runs/demo -i 3 --shard 2/16 --key rollout_shard[/] names a Slurm array task's shard.
    """
    import shlex

    from spade_cli.core.layout import RunLayout, parse_shard

    try:
        shard_t = parse_shard(shard) if shard else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--shard") from None
    table = RunLayout(run_dir).as_dict(iteration, shard_t)
    if shell:
        # One process per iteration instead of one per path: each `spade` start costs about a second.
        print("\n".join(f"{k}={shlex.quote(v)}" for k, v in table.items()))
        return
    if key is None:
        emit(table)
        return
    if key not in table:
        raise typer.BadParameter(f"choose one of {', '.join(table)}", param_hint="--key")
    print(table[key])


def register(app: typer.Typer) -> None:
    app.command("paths", rich_help_panel=PANEL_HELPERS)(command(paths))
