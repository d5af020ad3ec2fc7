"""`spade warmstart`: teach a fresh model the Designer's answer format with a short SFT on a pool."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spade_cli.cli import (
    PANEL_HELPERS,
    ConfigOpt,
    Contract,
    ForceOpt,
    SeedOpt,
    command,
    console,
    finish,
    resolved_config,
)

# A panel of its own: the Agent's options beside the Designer's would squeeze the help column.
AGENT = "The Agent's solver episodes"


def warmstart(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="Checkpoint to fine-tune (e.g. from init-model).")],
    out: Annotated[Path, typer.Option("--out", help="Checkpoint directory to write.", file_okay=False)],
    pool: Annotated[str, typer.Option("--pool", help="'bundled', 'starter' (short envs), 'family' (generated Designer targets), a folder of NAME.py + NAME.hint or a designs JSONL.")]
    = "bundled",
    epochs: Annotated[int, typer.Option("--epochs", help="Passes over the pool (fresh documents each); 0: "
                                        "the Agent's solver episodes only.", min=0)]
    = 12,
    learning_rate: Annotated[float, typer.Option("--learning-rate", help="Peak learning rate (cosine).")] = 2e-3,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Samples per step.", min=1)] = 2,
    max_examples: Annotated[int | None, typer.Option("--max-examples", help="Use only the N shortest envs.")]
    = None,
    corpus: Annotated[str | None, typer.Option("--corpus", help="Grounding corpus (default: bundled).")] = None,
    grounding: Annotated[bool, typer.Option("--grounding/--no-grounding", help="Documents in the prompts.")]
    = True,
    excerpt_chars: Annotated[int, typer.Option("--excerpt-chars", help="Document excerpt length.")] = 300,
    example: Annotated[bool, typer.Option("--example/--no-example",
                                          help="Include the worked example in the prompts.")] = False,
    thinking: Annotated[bool, typer.Option("--thinking/--no-thinking", help="Designer prompts as design "
                                           "--thinking renders them (on, as there).")] = True,
    solver_seeds: Annotated[int, typer.Option("--solver-seeds", min=0, rich_help_panel=AGENT,
                                                help="Also warm-start the Agent: seeds per env with a scripted solver.")]
    = 0,
    agent_noise: Annotated[float, typer.Option("--agent-noise", min=0.0, max=1.0, rich_help_panel=AGENT,
                                               help="Share of the solver's actions that are random "
                                                    "(0: imitating noise mostly taught noise).")] = 0.0,
    agent_max_turns: Annotated[int, typer.Option("--agent-max-turns", min=1, rich_help_panel=AGENT,
                                                 help="Turn cap of the solver episodes (rollout's --max-turns).")]
    = 16,
    agent_think: Annotated[bool, typer.Option("--agent-think/--no-agent-think", rich_help_panel=AGENT,
                                                 help="Agent prompts as rollout --thinking renders them.")] = True,
    contract: Annotated[Contract, typer.Option("--contract", help="The Designer prompts' system message "
                                          "(as `spade design --contract`).")] = "full",
    agent_pool: Annotated[str | None, typer.Option("--agent-pool", rich_help_panel=AGENT, help="Where the solver episodes' envs "
                                                   "come from (default: --pool).")] = None,
    memory_k: Annotated[int, typer.Option("--memory-k", min=0, help="Past environments the practice "
                                          "memory lists (as `spade design --memory-k`).")] = 12,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    force: ForceOpt = False,
) -> None:
    """Fine-tune a model on the example pool so it writes parseable environments (TRL SFTTrainer).

    The prompts are the Designer prompts `spade design` builds; use the same --excerpt-chars,
    --example and --thinking there. --solver-seeds N also imitates the scripted solvers of the
    starter envs (spade_cli/envs/solvers.py), played by the rollout engine on seeds that
    rollout and eval never draw, so the Agent starts with partial success for GRPO to improve.

    Example: [bold]spade warmstart --model ckpt/small --out ckpt/warm --epochs 12 --max-examples 6[/]
    """
    from spade_cli.designer.prompts import CONTRACTS
    from stages import warmstart as stage

    if epochs == 0 and solver_seeds == 0:
        raise typer.BadParameter("nothing to train: pass --epochs N (Designer) or --solver-seeds N (Agent)",
                                 param_hint="--epochs")
    if contract not in CONTRACTS:
        raise typer.BadParameter(f"{contract!r} is not one of {', '.join(CONTRACTS)}", param_hint="--contract")

    with console.status(f"warm-starting {model} on the {pool} pool"):
        summary = stage.run(out, model=model, pool=pool, epochs=epochs, learning_rate=learning_rate,
                            batch_size=batch_size, max_examples=max_examples, seed=seed, corpus=corpus,
                            grounding=grounding, excerpt_chars=excerpt_chars, example=example,
                            enable_thinking=thinking, agent_episodes=solver_seeds,
                            agent_noise=agent_noise, agent_max_turns=agent_max_turns,
                            agent_thinking=agent_think, contract=contract, agent_pool=agent_pool, memory_k=memory_k,
                            config=resolved_config(ctx), force=force)
    if summary.get("status") == "ok":
        console.print(f"[green]wrote[/] {out}: {summary['steps']} steps, loss {summary['first_loss']:.3f} → "
                      f"{summary['final_loss']:.3f} in {summary['train_seconds']} s")
    finish(summary)


def register(app: typer.Typer) -> None:
    app.command("warmstart", rich_help_panel=PANEL_HELPERS)(command(warmstart))
