"""`spade update`: GRPO on both roles from stored artifacts, written as a new checkpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import typer

from spade_cli.cli import PANEL_LOOP, ConfigOpt, ForceOpt, ModelOpt, SeedOpt, command, console, finish

_LOSS = "Loss (GRPOConfig names)"
_OPT = "Optimisation"
_STATE = "Trainer state"
# A panel of its own: beside other options its --no-... column would not fit 80 columns.
_SAMPLER = "Importance sampling"
_CREDIT = "Agent credit"
_ROLES = "Role balance"


def _opt(flag: str, help: str, panel: str = _LOSS, **kw: object) -> typer.models.OptionInfo:
    return typer.Option(flag, help=help, rich_help_panel=panel, **kw)


def update(
    model: ModelOpt,
    out: Annotated[Path, typer.Option("--out", help="Checkpoint directory to write (atomically).",
                                      file_okay=False)],
    designs: Annotated[list[str] | None, typer.Option("--envs", help="validated.jsonl / designs.jsonl; "
                                               "repeat, comma-separate or glob.")] = None,
    rollouts: Annotated[list[str] | None, typer.Option("--rollouts", help="rollouts.jsonl or shards; repeat, "
                                                "comma-separate or glob.")] = None,
    scores: Annotated[list[str] | None, typer.Option("--scores", help="scores.jsonl (designer_reward per env).")] = None,
    agent_episodes: Annotated[Literal["unhinted", "hinted", "both"], _opt("--agent-episodes", "Agent samples.")]
    = "unhinted",
    agent_credit: Annotated[Literal["episode", "turn"], _opt("--agent-credit", "episode (every reply gets the episode's "
                                      "advantage) or turn (each reply its reward-to-go).", _CREDIT)]
    = "episode",
    turn_gamma: Annotated[float, _opt("--turn-gamma", "Discount of the reward-to-go with --agent-credit "
                                      "turn (0: a reply's own reward only).", _CREDIT, min=0.0, max=1.0)] = 1.0,
    loss_type: Annotated[Literal["grpo", "bnpo", "dr_grpo", "dapo"], _opt("--loss-type", "TRL's loss definitions.")] = "dapo",
    scale_rewards: Annotated[Literal["group", "batch", "none"], _opt("--scale-rewards", "Advantage scaling.")] = "group",
    epsilon: Annotated[float, _opt("--epsilon", "PPO clip, lower side (and upper without --epsilon-high).")]
    = 0.2,
    epsilon_high: Annotated[float | None, _opt("--epsilon-high", "PPO clip, upper side (DAPO: 0.28).")] = None,
    delta: Annotated[float | None, _opt("--delta", "Two-sided clipping: cap on the ratio.")] = None,
    importance_sampling_level: Annotated[Literal["token", "sequence"], _opt("--importance-sampling-level", "sequence: GSPO.")]
    = "token",
    importance_sampling: Annotated[bool, _opt(
        "--tis/--no-tis",
        "Correct for the sampler with its stored log-probs (TIS).", _SAMPLER)] = True,
    tis_mode: Annotated[Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"], _opt(
        "--tis-mode", "TRL's names.", _SAMPLER)] = "token_truncate",
    tis_cap: Annotated[float | None, _opt("--tis-cap", "Upper cap of the correction weight.", _SAMPLER)] = 3.0,
    tis_min: Annotated[float | None, _opt("--tis-min", "Lower cap (default: none).", _SAMPLER)] = None,
    beta: Annotated[float, _opt("--beta", "KL coefficient (k3 estimator), both roles.")] = 0.0,
    kl_agent: Annotated[float | None, _opt("--kl-agent", "The Agent's KL coefficient (default: --beta).", _ROLES)]
    = None,
    kl_designer: Annotated[float | None, _opt("--kl-designer", "The Designer's KL coefficient (default: --beta).",
                                              _ROLES)] = None,
    kl_reference: Annotated[Literal["base", "previous"], _opt("--kl-reference", "KL to: base (the run's first model) or previous.")]
    = "base",
    temperature: Annotated[float, _opt("--temperature", "Sampling temperature of rows that record none.")]
    = 1.0,
    agent_temperature: Annotated[float | None, _opt("--agent-temperature", "The Agent's (default: as the "
                                                    "rows record).")] = None,
    designer_temperature: Annotated[float | None, _opt("--designer-temperature", "The Designer's (default: "
                                                       "as the rows record).")] = None,
    designer_share: Annotated[float, _opt("--designer-share", "The Designer's share of the policy loss over the "
                                          "update, the Agent's is 1 - it (0: Designer left out).", _ROLES,
                                          min=0.0, max=1.0)] = 0.5,
    invalid_reward: Annotated[float, _opt("--invalid-reward", "Designer reward of an invalid design that has no score row.")] = -1.0,
    max_completion_length: Annotated[int | None, _opt(
        "--dr-grpo-length", "dr_grpo's per-sequence divisor, TRL's max_completion_length; caps nothing "
        "(default: the longest completion).")] = None,
    learning_rate: Annotated[float, _opt("--learning-rate", "AdamW learning rate.", _OPT)] = 1e-6,
    lr_scheduler_type: Annotated[Literal["constant", "constant_with_warmup", "linear", "cosine"], _opt(
        "--lr-scheduler-type", "Over the whole run.", _OPT)] = "constant",
    warmup_steps: Annotated[int, _opt("--warmup-steps", "Warm-up optimizer steps.", _OPT, min=0)] = 0,
    max_steps: Annotated[int | None, _opt("--max-steps", "The run's total optimizer steps (linear, "
                                          "cosine).", _OPT, min=1)] = None,
    weight_decay: Annotated[float, _opt("--weight-decay", "AdamW weight decay.", _OPT)] = 0.0,
    per_device_train_batch_size: Annotated[int, _opt("--per-device-train-batch-size", "Sequences per "
                                                     "micro-batch.", _OPT, min=1)] = 8,
    gradient_accumulation_steps: Annotated[int, _opt("--gradient-accumulation-steps", "Micro-batches per "
                                                     "optimizer step.", _OPT, min=1)] = 1,
    num_iterations: Annotated[int, _opt("--num-iterations", "Passes over the samples (PPO epochs).", _OPT,
                                        min=1)] = 1,
    max_grad_norm: Annotated[float, _opt("--max-grad-norm", "Gradient clipping (0: off).", _OPT)] = 1.0,
    lora: Annotated[bool, _opt("--lora", "Train a LoRA adapter (peft), merged into the saved model.", _OPT)]
    = False,
    lora_r: Annotated[int, _opt("--lora-r", "LoRA rank.", _OPT)] = 16,
    lora_alpha: Annotated[int, _opt("--lora-alpha", "LoRA alpha.", _OPT)] = 32,
    bf16: Annotated[bool, _opt("--bf16", "bf16 autocast (GPU).", _OPT)] = False,
    gradient_checkpointing: Annotated[bool, _opt("--gradient-checkpointing", "Recompute activations.", _OPT)]
    = False,
    packing: Annotated[Literal["auto", "on", "off"], _opt("--packing", "Rows end to end without padding (auto: "
                                                          "where exact and cheaper).", _OPT)] = "auto",
    fresh_optimizer: Annotated[bool, _opt("--fresh-optimizer", "Ignore the input's trainer state.", _STATE)]
    = False,
    keep_state_every: Annotated[int, _opt("--keep-state-every", "Prune the input's state unless its "
                                          "update count is a multiple of N (0: keep all).", _STATE, min=0)] = 0,
    audit: Annotated[bool, _opt("--weight-audit/--no-weight-audit", "Weight-change audit in update.json.", _STATE)] = True,
    max_staleness: Annotated[int | None, _opt("--max-staleness", "Refuse samples drawn more than N updates "
                                              "before --model (the pipelined loop passes 1).", _STATE, min=0)]
    = None,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    force: ForceOpt = False,
) -> None:
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

    designs, rollouts, scores = designs or [], rollouts or [], scores or []
    cfg = stage.UpdateConfig(
        model=model, designs=designs, rollouts=rollouts, scores=scores, out=str(out),
        agent_episodes=agent_episodes, agent_credit=agent_credit, turn_gamma=turn_gamma, loss_type=loss_type, scale_rewards=scale_rewards, epsilon=epsilon,
        epsilon_high=epsilon_high, delta=delta, importance_sampling_level=importance_sampling_level,
        importance_sampling=importance_sampling, tis_mode=tis_mode, tis_cap=tis_cap, tis_min=tis_min, beta=beta,
        kl_reference=kl_reference, learning_rate=learning_rate, lr_scheduler_type=lr_scheduler_type,
        warmup_steps=warmup_steps, max_steps=max_steps, weight_decay=weight_decay, temperature=temperature,
        agent_temperature=agent_temperature, designer_temperature=designer_temperature, designer_share=designer_share,
        kl_agent=kl_agent, kl_designer=kl_designer, invalid_reward=invalid_reward,
        per_device_train_batch_size=per_device_train_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps, num_iterations=num_iterations,
        max_grad_norm=max_grad_norm, max_completion_length=max_completion_length, lora=lora, lora_r=lora_r,
        lora_alpha=lora_alpha, bf16=bf16, gradient_checkpointing=gradient_checkpointing, packing=packing,
        fresh_optimizer=fresh_optimizer, keep_state_every=keep_state_every, audit=audit,
        max_staleness=max_staleness, seed=seed)
    for name, value, allowed in (("--loss-type", loss_type, ("grpo", "bnpo", "dr_grpo", "dapo")),
                                 ("--scale-rewards", scale_rewards, ("group", "batch", "none")),
                                 ("--agent-episodes", agent_episodes, ("unhinted", "hinted", "both")),
                                 ("--agent-credit", agent_credit, ("episode", "turn")),
                                 ("--importance-sampling-level", importance_sampling_level,
                                  ("token", "sequence")),
                                 ("--tis-mode", tis_mode, ("token_truncate", "token_mask", "sequence_truncate",
                                                           "sequence_mask")),
                                 ("--kl-reference", kl_reference, ("base", "previous")),
                                 ("--packing", packing, ("auto", "on", "off")),
                                 ("--lr-scheduler-type", lr_scheduler_type, ("constant", "constant_with_warmup",
                                                                             "linear", "cosine"))):
        if value not in allowed:
            raise typer.BadParameter(f"choose one of {', '.join(allowed)}", param_hint=name)
    if not rollouts and not designs:
        raise typer.BadParameter("give --rollouts and/or --envs", param_hint="--rollouts")
    summary = stage.run(cfg, force=force, log=lambda msg: console.print(msg, soft_wrap=True))
    if os.environ.get("RANK", "0") != "0":  # under accelerate launch / torchrun only rank 0 reports
        return
    if summary.get("unchanged"):
        console.print(f"[yellow]wrote[/] {out}: the input model unchanged (no sample carries a learning signal)")
    elif summary.get("status") == "ok":
        resumed = f", resumed {summary['resumed_state']}" if summary.get("resumed_state") else ", fresh optimizer"
        console.print(f"[green]wrote[/] {out}: {summary['samples']} samples, loss {summary['loss']:.4g}{resumed}")
    finish(summary)


def register(app: typer.Typer) -> None:
    app.command("update", rich_help_panel=PANEL_LOOP)(command(update))
