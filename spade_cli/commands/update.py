"""`spade update`: GRPO on both roles from stored artifacts, written as a new checkpoint."""

from __future__ import annotations

import os

import typer

from spade_cli.cli import PANEL_LOOP, ConfigOpt, ForceOpt, command, config_options, console, finish
from stages.update import UpdateConfig  # its settings, declared once (spade_cli/training/config.py)


# Every setting and its help are declared once, in UpdateConfig: the options come from there.
@config_options(UpdateConfig)
def update(cfg: UpdateConfig, config: ConfigOpt = None, force: ForceOpt = False) -> None:
    """Update one model in both roles with GRPO from stored episodes, designs and scores.

    Agent episodes are grouped by environment (advantage from the return; environment tokens get no
    gradient), Designer completions by prompt group (advantage from designer_reward). Groups
    without reward spread are dropped. Runs unchanged under `accelerate launch` (DeepSpeed, FSDP
    configs in recipes/accelerate/). Writes a Hugging Face checkpoint in the input's dtype, the
    trainer state beside it (trainer_state/: fp32 master weights, AdamW, scheduler, RNG) and
    update.json; given such a checkpoint as --model, the next update resumes its state.

    Example: [bold]spade update --model ckpt/tiny --envs validated.jsonl --rollouts 'rollouts*.jsonl'
    --scores scores.jsonl --out ckpt/iter_0001[/]
    """
    from stages import update as stage

    if not cfg.rollouts and not cfg.envs:
        raise typer.BadParameter("give --rollouts and/or --envs", param_hint="--rollouts")
    summary = stage.run(cfg, force=force, log=lambda msg: console.print(msg, soft_wrap=True))
    if os.environ.get("RANK", "0") != "0":  # under accelerate launch / torchrun only rank 0 reports
        return
    if summary.get("unchanged"):
        console.print(f"[yellow]wrote[/] {cfg.out}: the input model unchanged (no sample carries a learning signal)")
    elif summary.get("status") == "ok":
        resumed = f", resumed {summary['resumed_state']}" if summary.get("resumed_state") else ", fresh optimizer"
        console.print(f"[green]wrote[/] {cfg.out}: {summary['samples']} samples, loss {summary['loss']:.4g}{resumed}")
    finish(summary)


def register(app: typer.Typer) -> None:
    app.command("update", rich_help_panel=PANEL_LOOP)(command(update))
