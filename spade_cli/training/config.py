"""The settings of `spade update`, in a module of their own: the stage and the library's pieces
(``spade_cli.training.samples``, ``trainer``, ``loop``) all read them, and none imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class UpdateConfig:
    """The knobs, named as in TRL's GRPOConfig where one exists."""

    model: str
    designs: list[str] = field(default_factory=list)
    rollouts: list[str] = field(default_factory=list)
    scores: list[str] = field(default_factory=list)
    out: str = "ckpt"
    agent_episodes: str = "unhinted"  # unhinted | hinted | both
    agent_credit: str = "episode"  # episode (the paper's GRPO) | turn (each reply's reward-to-go)
    turn_gamma: float = 1.0  # the reward-to-go's discount with turn credit
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    importance_sampling: bool = True  # the sampler correction (TIS)
    tis_mode: str = "token_truncate"  # TRL's vllm_importance_sampling_mode names
    tis_cap: float | None = 3.0  # TRL's vllm_importance_sampling_clip_max
    tis_min: float | None = None
    beta: float = 0.0
    kl_agent: float | None = None  # the Agent's KL coefficient (None: beta)
    kl_designer: float | None = None  # the Designer's (None: beta)
    kl_reference: str = "base"  # base (the run's iteration-0 model) | previous (the input)
    use_bias_correction_kl: bool = True
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    max_steps: int | None = None  # the run's total optimizer steps (linear / cosine decay)
    temperature: float = 1.0  # for rows that record no sampling temperature
    agent_temperature: float | None = None
    designer_temperature: float | None = None
    designer_share: float = 0.5  # the Designer's share of the update's policy loss; the Agent's is 1 - it
    invalid_reward: float = -1.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    num_iterations: int = 1
    max_grad_norm: float = 1.0
    max_completion_length: int | None = None
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    bf16: bool = False
    gradient_checkpointing: bool = False
    packing: str = "auto"  # auto | on | off: rows end to end, no padding (spade_cli.training.packing)
    fresh_optimizer: bool = False
    keep_state_every: int = 0  # prune superseded trainer states unless updates % N == 0 (0: keep all)
    audit: bool = True
    max_staleness: int | None = None  # refuse samples drawn more than N updates before --model (None: any)
    seed: int = 0
