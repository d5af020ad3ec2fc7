"""The settings of `spade update`, each declared once: its name (the flag, the ``--config`` key and
the manifest's key), default, help and help panel (``spade_cli.core.settings``). The command's options
are built from this dataclass; the stage and the library's pieces (``spade_cli.training.samples``,
``trainer``, ``loop``) read it, and none imports another for it. Names follow TRL's GRPOConfig
where one exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from spade_cli.core.settings import setting

# Help panels, in the order `spade update --help` lists them (the inputs come first, unpanelled).
AGENT = "Agent samples"
LOSS = "Loss (GRPOConfig names)"
SAMPLER = "Importance sampling"  # a panel of its own: beside others its --no-... column would not fit 80 columns
ROLES = "Role balance"
OPT = "Optimisation"
STATE = "Trainer state"
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]  # spade_cli.training.grpo.LOSS_TYPES
Scale = Literal["group", "batch", "none"]  # spade_cli.training.grpo.SCALES
TisMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]  # grpo.TIS_MODES
Scheduler = Literal["constant", "constant_with_warmup", "linear", "cosine"]


@dataclass
class UpdateConfig:
    """The update's settings (``spade update --help`` lists them from here)."""

    model: str = setting(help="Hugging Face checkpoint directory or id.")
    envs: list[str] = setting(help="validated.jsonl / designs.jsonl; repeat, comma-separate or glob.", factory=list)
    rollouts: list[str] = setting(help="rollouts.jsonl or shards; repeat, comma-separate or glob.", factory=list)
    scores: list[str] = setting(help="scores.jsonl (designer_reward per env).", factory=list)
    out: str = setting("ckpt", "Checkpoint directory to write (atomically).", required=True, file_okay=False)
    seed: int = setting(0, "Run seed; every derived seed comes from it.")

    agent_episodes: Literal["unhinted", "hinted", "both"] = setting("unhinted", "Agent samples.", panel=AGENT)
    agent_credit: Literal["episode", "turn"] = setting(
        "episode", "episode (every reply gets the episode's advantage, the paper's GRPO) or turn (each reply "
        "its reward-to-go).", panel=AGENT)
    turn_gamma: float = setting(1.0, "Discount of the reward-to-go with --agent-credit turn (0: a reply's own "
                                "reward only).", panel=AGENT, min=0.0, max=1.0)

    loss_type: LossType = setting("dapo", "TRL's loss definitions.", panel=LOSS)
    scale_rewards: Scale = setting("group", "Advantage scaling.", panel=LOSS)
    epsilon: float = setting(0.2, "PPO clip, lower side (and upper without --epsilon-high).", panel=LOSS)
    epsilon_high: float | None = setting(None, "PPO clip, upper side (DAPO: 0.28).", panel=LOSS)
    delta: float | None = setting(None, "Two-sided clipping: cap on the ratio.", panel=LOSS)
    importance_sampling_level: Literal["token", "sequence"] = setting("token", "sequence: GSPO.", panel=LOSS)
    beta: float = setting(0.0, "KL coefficient (k3 estimator), both roles.", panel=LOSS)
    kl_reference: Literal["base", "previous"] = setting(
        "base", "KL to: base (the run's first model) or previous (the input).", panel=LOSS)
    use_bias_correction_kl: bool = True  # no option: TRL's default, kept fixed: the k3 estimator's bias fix
    temperature: float = setting(1.0, "Sampling temperature of rows that record none.", panel=LOSS)
    invalid_reward: float = setting(-1.0, "Designer reward of an invalid design that has no score row.",
                                    panel=LOSS)
    dr_grpo_length: int | None = setting(
        None, "dr_grpo's per-sequence divisor, TRL's max_completion_length; caps nothing (stored episodes "
        "are trained, nothing is generated; default: the longest completion).", panel=LOSS)

    tis: bool = setting(True, "Correct for the sampler with its stored log-probs (TIS).", panel=SAMPLER)
    tis_mode: TisMode = setting("token_truncate", "TRL's vllm_importance_sampling_mode names.", panel=SAMPLER)
    tis_cap: float | None = setting(3.0, "Upper cap of the correction weight (TRL's "
                                    "vllm_importance_sampling_clip_max).", panel=SAMPLER)
    tis_min: float | None = setting(None, "Lower cap (default: none).", panel=SAMPLER)

    kl_agent: float | None = setting(None, "The Agent's KL coefficient (default: --beta).", panel=ROLES)
    kl_designer: float | None = setting(None, "The Designer's KL coefficient (default: --beta).", panel=ROLES)
    agent_temperature: float | None = setting(None, "The Agent's (default: as the rows record).", panel=ROLES)
    designer_temperature: float | None = setting(None, "The Designer's (default: as the rows record).",
                                                 panel=ROLES)
    designer_share: float = setting(0.5, "The Designer's share of the policy loss over the update, the "
                                    "Agent's is 1 - it (0: Designer left out).", panel=ROLES, min=0.0, max=1.0)

    learning_rate: float = setting(1e-6, "AdamW learning rate.", panel=OPT)
    lr_scheduler_type: Scheduler = setting("constant", "Over the whole run.", panel=OPT)
    warmup_steps: int = setting(0, "Warm-up optimizer steps.", panel=OPT, min=0)
    max_steps: int | None = setting(None, "The run's total optimizer steps (linear, cosine).", panel=OPT, min=1)
    weight_decay: float = setting(0.0, "AdamW weight decay.", panel=OPT)
    per_device_train_batch_size: int = setting(8, "Sequences per micro-batch.", panel=OPT, min=1)
    gradient_accumulation_steps: int = setting(1, "Micro-batches per optimizer step.", panel=OPT, min=1)
    num_iterations: int = setting(1, "Passes over the samples (PPO epochs).", panel=OPT, min=1)
    max_grad_norm: float = setting(1.0, "Gradient clipping (0: off).", panel=OPT)
    lora: bool = setting(False, "Train a LoRA adapter (peft), merged into the saved model.", panel=OPT)
    lora_r: int = setting(16, "LoRA rank.", panel=OPT)
    lora_alpha: int = setting(32, "LoRA alpha.", panel=OPT)
    bf16: bool = setting(False, "bf16 autocast (GPU).", panel=OPT)
    gradient_checkpointing: bool = setting(False, "Recompute activations.", panel=OPT)
    packing: Literal["auto", "on", "off"] = setting(
        "auto", "Rows end to end without padding (auto: where exact and cheaper; spade_cli.training.packing).",
        panel=OPT)

    fresh_optimizer: bool = setting(False, "Ignore the input's trainer state.", panel=STATE)
    keep_state_every: int = setting(0, "Prune the input's state unless its update count is a multiple of N "
                                    "(0: keep all).", panel=STATE, min=0)
    weight_audit: bool = setting(True, "Weight-change audit in update.json.", panel=STATE)
    max_staleness: int | None = setting(None, "Refuse samples drawn more than N updates before --model (the "
                                        "pipelined loop passes 1; default: any).", panel=STATE, min=0)
