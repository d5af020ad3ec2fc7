"""`spade validate`: run every designed environment in the sandbox and record a verdict per row."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from spade_cli.cli import (
    PANEL_LOOP,
    ConfigOpt,
    ForceOpt,
    MinTier,
    OutFileOpt,
    SeedOpt,
    Tier,
    command,
    console,
    finish,
)

TierOpt = Annotated[Tier, typer.Option("--tier", help="Sandbox tier (auto: strong when bubblewrap works).")]
MinTierOpt = Annotated[MinTier, typer.Option("--min-tier", help="Refuse to run below this tier (fail closed).")]
ScratchOpt = Annotated[int, typer.Option("--scratch-mb", min=1, help="Total size of each env's working "
                                         "dir (MiB); past it: disk_limit. Keep validate's and rollout's equal.")]


def validate(
    ctx: typer.Context,
    designs: Annotated[list[str], typer.Option("--designs", help="spade.design/1 JSONL files or globs.")],
    out: OutFileOpt,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Designs checked in parallel "
                                                "(threads, each waiting on its env processes); default "
                                                "2 per usable CPU core.")] = None,
    tier: TierOpt = "auto",
    min_tier: MinTierOpt = "process",
    memory: Annotated[Path | None, typer.Option("--memory", help="spade.memory/1 JSONL: known envs are "
                                                "flagged `duplicate`.", dir_okay=False)] = None,
    max_env_steps: Annotated[int, typer.Option("--max-env-steps", min=1, help="Env steps per validation episode.")] = 16,
    trivial_return: Annotated[float, typer.Option("--trivial-return", help="A degenerate or random policy "
                                                  "reaching this return makes the env `trivial`.")] = 0.8,
    scratch_mb: ScratchOpt = 64,
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Check each design in a confined process: static checks, import, the reset/step contract on
    scripted, degenerate and random policies, return range, determinism (also under another
    PYTHONHASHSEED), hint leak, missing hint, triviality and duplicates. One spade.validation/1 row
    per input row; the first failed check is its `reason`.

    Example: [bold]spade validate --designs designs.jsonl --out validated.jsonl --workers 2[/]
    """
    from spade_cli.cli import resolved_config
    from stages import validate as stage

    if tier not in ("auto", "process", "strong"):
        raise typer.BadParameter("choose auto, process or strong", param_hint="--tier")
    if min_tier not in ("process", "strong"):
        raise typer.BadParameter("choose process or strong", param_hint="--min-tier")
    last = [time.monotonic()]

    def progress(done: int, total: int) -> None:
        if done == total or time.monotonic() - last[0] > 10:
            last[0] = time.monotonic()
            console.print(f"validated {done}/{total}")

    summary = stage.run(designs, out, memory=memory, workers=workers, tier=tier, min_tier=min_tier,
                        max_steps=max_env_steps, seed=seed, trivial_return=trivial_return, scratch_mb=scratch_mb,
                        force=force,
                        config=resolved_config(ctx), progress=progress)
    for w in summary.get("warnings", []):
        console.print(f"[yellow]warning:[/] {w}")
    if summary.get("status") == "ok":
        console.print(f"[green]{summary['valid']}/{summary['rows']} valid[/] ({summary['tier']} tier); "
                      f"invalid: {summary['invalid'] or 'none'}")
    finish(summary)


def register(app: typer.Typer) -> None:
    app.command("validate", rich_help_panel=PANEL_LOOP)(command(validate))
