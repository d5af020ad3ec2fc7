"""`spade init-model`: a random Qwen3 checkpoint with a local tokenizer, built offline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from spade_cli.cli import PANEL_HELPERS, command, console, finish


def init_model(
    out: Annotated[Path, typer.Option("--out", help="Checkpoint directory to create.", file_okay=False)],
    size: Annotated[str, typer.Option("--size", help="tiny (~0.4M params, tests) or small (~13M, quickstart).")]
    = "tiny",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random initialisation.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if OUT already holds this model.")]
    = False,
) -> None:
    """Build a random-initialised Qwen3 checkpoint and byte-level BPE tokenizer, fully offline.

    The result loads with transformers, TRL, lm-eval and vLLM (head_dim 64) and has a Qwen3-style
    chat template with <think> and tool-call tokens.

    Example: [bold]spade init-model --out ckpt/tiny --size tiny[/]
    """
    import json

    from spade_cli import tinymodel

    if size not in tinymodel.SIZES:
        raise typer.BadParameter(f"choose one of {', '.join(tinymodel.SIZES)}", param_hint="--size")
    marker = out / "spade_init.json"
    if not force and marker.exists():
        info = json.loads(marker.read_text())
        if info.get("size") == size and info.get("seed") == seed:
            finish({"status": "up to date", "out": str(out), **info})
            return
    t0 = time.perf_counter()
    with console.status(f"building a {size} Qwen3 checkpoint in {out}"):
        summary = tinymodel.build(out, size=size, seed=seed)
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    console.print(f"[green]wrote[/] {out}: {summary['params']:,} parameters, vocab {summary['vocab']}")
    finish({"status": "ok", **summary})


def register(app: typer.Typer) -> None:
    app.command("init-model", rich_help_panel=PANEL_HELPERS)(command(init_model))
