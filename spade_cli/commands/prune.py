"""`spade prune`: the loop's retention of checkpoints and trainer states (see ``stages.prune``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spade_cli.cli import PANEL_HELPERS, command, console, finish


def prune(
    run_dir: Annotated[Path, typer.Argument(help="The run directory (runs/NAME).", exists=True, file_okay=False)],
    iteration: Annotated[int, typer.Option("--iteration", "-i", min=0,
                                           help="The iteration whose update just finished.")],
    keep_ckpts: Annotated[int, typer.Option("--keep-ckpts", min=1,
                                            help="Served checkpoints kept back from the latest, itself included.")] = 2,
    keep_state_every: Annotated[int, typer.Option(
        "--keep-state-every", min=0,
        help="Also keep the trainer states whose update count is a multiple of N (0: the latest only).")] = 0,
    eval_every: Annotated[int, typer.Option("--eval-every", min=0,
                                            help="Keep the checkpoints of iterations that are multiples of E.")] = 0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would go; delete nothing.")] = False,
) -> None:
    """Delete superseded trainer states and served weights a run no longer needs, after an update.

    Keeps the latest trainer state, the latest --keep-ckpts checkpoints, the eval points, every
    checkpoint an unfinished update still reads or a live server of the run serves; manifests,
    update.json and configs stay, so a rerun of the loop resumes. Deletes only what spade update
    wrote inside the run, never through a link, and says what it kept and why. A rerun finishes a
    killed prune. Example: [bold]spade prune runs/demo -i 7 --eval-every 25[/]
    """
    from stages import prune as stage

    result = stage.prune(run_dir, iteration, keep_ckpts=keep_ckpts, keep_state_every=keep_state_every,
                         eval_every=eval_every, dry_run=dry_run)
    if result["status"] != "nothing to do":
        for line in stage.describe(result):
            console.print(line, soft_wrap=True, markup=False, highlight=False)
    finish(result)


def register(app: typer.Typer) -> None:
    app.command("prune", rich_help_panel=PANEL_HELPERS)(command(prune))
