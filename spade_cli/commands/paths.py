"""`spade paths`: the run-directory layout, for recipes that must not spell paths themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spade_cli.cli import PANEL_HELPERS, command, emit


def paths(
    run_dir: Annotated[Path, typer.Argument(help="The run directory (runs/NAME).")],
    iteration: Annotated[int, typer.Option("--iteration", "-i", help="Iteration number.")] = 0,
    key: Annotated[str | None, typer.Option("--key", help="Print only this path, as plain text.")] = None,
    shell: Annotated[bool, typer.Option(
        "--shell", help="Print KEY=VALUE lines, shell-quoted, for `eval` in a recipe.")] = False,
) -> None:
    """Print the artifact paths of one iteration of a run as one JSON object.

    Example: [bold]spade paths runs/demo -i 3 --key validated[/]; in a recipe
    [bold]eval "$(spade paths runs/demo -i 3 --shell)"[/] sets $designs, $memory, $next_ckpt, ...
    """
    import shlex

    from spade_cli.layout import RunLayout

    table = RunLayout(run_dir).as_dict(iteration)
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
