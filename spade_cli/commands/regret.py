"""`spade regret`: score an iteration's environments for the Designer, write the next memory, pick replays."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spade_cli.cli import PANEL_LOOP, ConfigOpt, ForceOpt, OutFileOpt, Signal, command, console, finish

PANEL_SIGNAL = "Signal"
PANEL_REPLAY = "Memory and replay"


def regret(
    envs: Annotated[list[str], typer.Option(
        "--envs", help="The iteration's designs: its validated.jsonl (several files or a glob).")],
    rollouts: Annotated[list[str], typer.Option(
        "--rollouts", help="Rollout JSONL: files, shards or a glob.")],
    out: OutFileOpt,
    played: Annotated[list[str] | None, typer.Option(
        "--played", rich_help_panel=PANEL_REPLAY,
        help="Envs the rollout played beside the designs (the replay file, a fixed set): no score row, "
        "in no mean or Vendi score; a past design among them updates its memory history, others never "
        "enter the memory.")] = None,
    memory: Annotated[Path | None, typer.Option(
        "--memory", dir_okay=False, rich_help_panel=PANEL_REPLAY,
        help="The memory as of this iteration (read only; omit it in the first iteration).")] = None,
    memory_out: Annotated[Path | None, typer.Option(
        "--memory-out", dir_okay=False, rich_help_panel=PANEL_REPLAY,
        help="Where to write the memory after this iteration: a new file, never --memory.")] = None,
    signal: Annotated[Signal, typer.Option(
        "--signal", rich_help_panel=PANEL_SIGNAL, help="Designer reward.")]
    = "regret",
    clip_negative: Annotated[bool, typer.Option(
        "--clip-negative", rich_help_panel=PANEL_SIGNAL, help="Clip a negative regret reward to 0.")] = False,
    invalid_reward: Annotated[float, typer.Option(
        "--invalid-reward", rich_help_panel=PANEL_SIGNAL,
        help="Reward of invalid designs and parse failures.")]
    = -1.0,
    shuffle_rewards: Annotated[bool, typer.Option(
        "--shuffle-rewards", rich_help_panel=PANEL_SIGNAL,
        help="Control arm: permute the earned rewards among the iteration's valid designs "
        "(docs/curriculum.md).")] = False,
    pool_cells: Annotated[str | None, typer.Option(
        "--pool-cells", rich_help_panel=PANEL_SIGNAL, metavar="FIELDS",
        help="Spec fields that make a cell, comma-separated (e.g. rule,level): each valid spec design "
        "is paid its cell's signal, the episodes of the iteration's designs in that cell pooled "
        "(docs/regret.md).")] = None,
    success_threshold: Annotated[float, typer.Option(
        "--success-threshold", rich_help_panel=PANEL_SIGNAL,
        help="An episode succeeds when its return reaches this (learnability, ema_lp).")] = 0.5,
    iteration: Annotated[int | None, typer.Option(
        "--iteration", help="Iteration number (default: the one in the --envs rows).")] = None,
    before_rollouts: Annotated[list[str] | None, typer.Option(
        "--before-rollouts", rich_help_panel=PANEL_SIGNAL,
        help="ema_lp: the previous Agent's rollouts of these envs on the same seeds; their unhinted "
        "success opens each env's history, so a new env's learning progress is defined.")] = None,
    replay: Annotated[int, typer.Option(
        "--replay", min=0, rich_help_panel=PANEL_REPLAY, help="Write the K most promising memory envs.")] = 0,
    replay_out: Annotated[Path | None, typer.Option(
        "--replay-out", dir_okay=False, rich_help_panel=PANEL_REPLAY,
        help="Where --replay writes its spade.validation/1 rows.")] = None,
    replay_temperature: Annotated[float, typer.Option(
        "--replay-temperature", min=1e-6, rich_help_panel=PANEL_REPLAY,
        help="PLR beta: P_S ∝ (1/rank)^(1/beta) on positive regret.")] = 0.1,
    replay_staleness: Annotated[float, typer.Option(
        "--replay-staleness", min=0.0, max=1.0, rich_help_panel=PANEL_REPLAY,
        help="PLR rho: weight of the staleness distribution.")] = 0.1,
    embedding: Annotated[str, typer.Option(
        "--embedding", envvar="SPADE_EMBEDDING",
        help="Diversity embedding: auto (minilm if installed), tfidf, minilm or a model dir.")] = "auto",
    seed_audit: Annotated[bool, typer.Option(
        "--seed-audit/--no-seed-audit", help="Replay each env's best hinted actions on other seeds in the sandbox: "
        "solving most of them flags it seed_invariant.")] = True,
    audit_seeds: Annotated[int, typer.Option("--audit-seeds", min=1, help="Seeds each audit replays.")] = 4,
    flagged_reward: Annotated[float | None, typer.Option(
        "--flagged-reward", help="designer_reward of a flagged env (default: --invalid-reward).")] = None,
    max_error_rate: Annotated[float, typer.Option(
        "--max-error-rate", min=0.0, max=1.0, rich_help_panel=PANEL_SIGNAL,
        help="An env whose failed episodes exceed this share is invalid (flag rollout_errors).")] = 0.25,
    config: ConfigOpt = None,
    force: ForceOpt = False,
) -> None:
    """Turn rollouts into the Designer's reward (one spade.score/1 row per design), merge the iteration
    with the memory as of this iteration into a new memory file, optionally write replay envs, and
    report the Vendi diversity.

    Only the designs in --envs are scored; envs given with --played (replays, a fixed set) are read
    for their episodes but never scored as designs.

    Example: [bold]spade regret --envs validated.jsonl --rollouts 'rollouts*.jsonl' --out scores.jsonl
    --memory-out memory/iter_0001.jsonl --replay 4 --replay-out replay.jsonl[/] (iteration i reads
    memory/iter_i.jsonl with --memory, from iteration 1 on)
    """
    from stages import regret as stage

    if signal not in ("regret", "ema_lp", "learnability"):
        raise typer.BadParameter("choose regret, ema_lp or learnability", param_hint="--signal")
    if replay and replay_out is None:
        raise typer.BadParameter("--replay K needs --replay-out FILE", param_hint="--replay-out")
    fields = tuple(f.strip() for f in (pool_cells or "").split(",") if f.strip())
    if pool_cells is not None and not fields:
        raise typer.BadParameter("name at least one spec field, e.g. rule,level", param_hint="--pool-cells")
    summary = stage.run(envs, rollouts, out, played=played, memory=memory, memory_out=memory_out, signal=signal, clip_negative=clip_negative,
                        invalid_reward=invalid_reward, iteration=iteration, before_rollouts=before_rollouts,
                        success_threshold=success_threshold,
                        replay=replay, replay_out=replay_out, replay_temperature=replay_temperature,
                        replay_staleness=replay_staleness, embedding=embedding, audit=seed_audit,
                        audit_seeds=audit_seeds, flagged_reward=flagged_reward,
                        max_error_rate=max_error_rate, shuffle_rewards=shuffle_rewards, pool_cells=fields, force=force)
    warnings = summary.get("warnings", [])
    for w in warnings[:5]:  # one per env without rollouts can be many: the manifest keeps them all
        console.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    if len(warnings) > 5:
        console.print(f"[yellow]warning:[/] {len(warnings) - 5} more in {out}.manifest.json")
    if summary.get("status") == "ok":
        console.print(f"[green]scored[/] {summary['rows']} designs ({summary['valid']} valid, "
                      f"{summary['episodes']} episodes) -> {out}; Vendi/n {summary['vendi_per_n']}")
    finish(summary)


def register(app: typer.Typer) -> None:
    app.command("regret", rich_help_panel=PANEL_LOOP)(command(regret))
