"""The GRPO family of losses, group-relative advantages and batch layout, as pure functions.

``spade update`` trains one model in two roles from stored samples. This module holds the math and
nothing else (no model, no files), so every formula can be checked by hand in a unit test:

- ``group_advantages``: reward minus its group mean, divided by the group std (``scale="group"``),
  the batch std (``"batch"``) or nothing (``"none"``, Dr. GRPO). Groups may have different sizes
  (an environment may lose an errored episode). A group whose rewards do not vary (or has a single
  member) has no learning signal; its rows are flagged so the caller drops them.
- ``per_token_loss``: PPO clipping of the importance ratio ``exp(logp - old_logp)`` with
  ``epsilon`` / ``epsilon_high`` and optional two-sided ``delta``, token or sequence (GSPO) level,
  plus the k3 KL estimate to a reference, weighted per sequence (the role weights).
- ``aggregate``: the normalisations of TRL's ``grpo``, ``bnpo``, ``dr_grpo`` and ``dapo``;
  ``row_scales`` is the same normalisation computed per role over a whole optimizer step, so one
  role's token count never scales the other role's gradient.
- ``sampler_correction``: the truncated importance-sampling weight (TIS) between the trainer's
  old log-probs and the sampler's stored ones, TRL's ``vllm_importance_sampling_correction``.
- ``plan_steps`` and ``collate``: which samples go into which micro-batch on which process, and
  the padded tensors of one micro-batch (prompts left-padded, completions right-padded, as in TRL).

The formulas reproduce ``GRPOTrainer._compute_loss`` of TRL 1.16 term by term (same epsilons,
``1e-4`` std guard, Bessel-corrected std, KL added after the ratio is applied, bias-corrected KL),
so that numbers from ``spade update`` mean what they mean in TRL. One addition: a per-sequence
``weight`` multiplies the policy term, which is how the Agent and Designer weights enter one loss;
with all weights 1 the loss is exactly TRL's.

Example::

    adv, keep = group_advantages(torch.tensor([1., 0., 1., 0.]), [0, 0, 1, 1], scale="group")
    ptl, ratio, kl = per_token_loss(logps, old_logps, adv, mask)
    loss = aggregate(ptl, mask, "dapo", num_items=mask.sum())
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALES = ("group", "batch", "none")
STD_EPS = 1e-4  # TRL's guard against division by a tiny std


def _std(x: torch.Tensor) -> float:
    """Bessel-corrected std (TRL's nanstd without NaNs); NaN for fewer than two values."""
    n = x.numel()
    if n < 2:
        return math.nan
    return float(((x - x.mean()) ** 2).sum() / (n - 1)) ** 0.5


def group_advantages(rewards: torch.Tensor, groups: Sequence, scale: str = "group",
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and a keep-mask for rows grouped by ``groups`` (any hashable label per row).

    Rows of groups with zero spread (all rewards equal, or a single row) get advantage 0 and
    ``keep`` False: they carry no signal and would only dilute the token normalisers.
    """
    if scale not in SCALES:
        raise ValueError(f"scale_rewards must be one of {SCALES}, got {scale!r}")
    rewards = rewards.to(torch.float64)
    adv = torch.zeros_like(rewards)
    keep = torch.zeros(rewards.shape, dtype=torch.bool)
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    batch_std = _std(rewards) if scale == "batch" else 1.0
    for idx in members.values():
        r = rewards[idx]
        if len(idx) < 2 or bool((r == r[0]).all()):
            continue
        centred = r - r.mean()
        if scale == "group":
            centred = centred / (_std(r) + STD_EPS)
        elif scale == "batch":
            centred = centred / (batch_std + STD_EPS)
        adv[idx] = centred
        keep[idx] = True
    return adv.to(torch.float32), keep


def per_token_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor, *, epsilon: float = 0.2, epsilon_high: float | None = None,
                   delta: float | None = None, importance_sampling_level: str = "token",
                   beta: float | torch.Tensor = 0.0, ref_logps: torch.Tensor | None = None,
                   use_bias_correction_kl: bool = True, weights: torch.Tensor | None = None,
                   is_ratio: torch.Tensor | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-token GRPO loss (B, T), the importance ratio and the per-token KL (or None).

    ``logps``/``old_logps``/``ref_logps``/``mask``: (B, T); ``advantages`` and ``weights``: (B,);
    ``beta``: one coefficient or one per row, (B,);
    ``is_ratio``: the sampler correction, (B, T) or (B, 1), multiplying the policy term only
    (TRL applies it before adding the KL).
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    log_ratio = logps - old_logps
    if importance_sampling_level == "token":
        log_w = log_ratio
    elif importance_sampling_level == "sequence":
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {importance_sampling_level!r}")
    coef_1 = torch.exp(log_w)
    kl = None
    if isinstance(beta, torch.Tensor) or beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs reference log-probs")
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        if use_bias_correction_kl:
            kl = kl * coef_1
    coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + eps_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    loss = -torch.min(coef_1 * adv, coef_2 * adv)
    if is_ratio is not None:
        loss = loss * is_ratio
    if weights is not None:
        loss = loss * weights.unsqueeze(-1)
    if kl is not None:
        loss = loss + (beta.unsqueeze(-1) if isinstance(beta, torch.Tensor) else beta) * kl
    # Sequence-level ratios are (B, 1); broadcast so every caller sees (B, T).
    return loss.expand_as(mask).contiguous() if loss.shape != mask.shape else loss, coef_1, kl


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, *,
              max_completion_length: int | None = None, num_items: torch.Tensor | float | None = None,
              ) -> torch.Tensor:
    """Reduce a micro-batch's per-token loss the way TRL's ``loss_type`` does.

    ``grpo``: mean over sequences of each sequence's token mean. ``bnpo``: token mean over the
    micro-batch. ``dr_grpo``: token sum / (sequences x ``max_completion_length``). ``dapo``: token
    sum / ``num_items``, the active tokens of the whole optimizer step divided by the number of
    processes (the caller supplies it; defaults to this micro-batch's tokens).
    Division by the gradient-accumulation steps is left to the caller (accelerate does it).
    """
    masked = per_token * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        if not max_completion_length:
            raise ValueError("dr_grpo needs max_completion_length")
        return masked.sum() / (per_token.size(0) * max_completion_length)
    if loss_type == "dapo":
        n = mask.sum() if num_items is None else num_items
        return masked.sum() / torch.as_tensor(n, dtype=masked.dtype).clamp(min=1.0)
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


TIS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def sampler_correction(old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                       cap: float | None, cap_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's vLLM importance-sampling correction: ``exp(old - sampler)`` per token (``token_*``) or
    of the summed difference per sequence (``sequence_*``), clamped to [cap_min, cap] (``*_truncate``)
    or zeroed outside it (``*_mask``). Returns (weights (B, T) or (B, 1), raw ratios same shape).

    ``old_logps`` are the trainer's log-probs before the first optimizer step, ``sampler_logps``
    what the sampler stored; rows without stored log-probs should carry ``sampler = old`` (ratio 1).
    """
    if mode not in TIS_MODES:
        raise ValueError(f"tis_mode must be one of {TIS_MODES}, got {mode!r}")
    diff = torch.nan_to_num((old_logps - sampler_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    raw = torch.exp(diff)
    if mode.endswith("truncate"):
        return (raw if cap is None and cap_min is None else torch.clamp(raw, min=cap_min, max=cap)), raw
    lo = -math.inf if cap_min is None else cap_min
    hi = math.inf if cap is None else cap
    return raw.masked_fill((raw < lo) | (raw > hi), 0.0), raw


def row_scales(loss_type: str, roles: Sequence[str], tokens: Sequence[int], micro_batch: Sequence,
               max_completion_length: int | None = None) -> list[float]:
    """The factor ``c_b`` of each real row of one optimizer step (all processes together) such that
    the step's loss is ``sum_b c_b * sum_t l_bt m_bt``, normalised per role:

    - ``dapo``: 1 / (the role's trained tokens in the step)
    - ``grpo``: 1 / (the role's sequences in the step x the row's own tokens)
    - ``bnpo``: 1 / (micro-batches holding the role x the role's tokens in the row's micro-batch)
    - ``dr_grpo``: 1 / (the role's sequences in the step x ``max_completion_length``)

    With one role and full micro-batches these are TRL's normalisations exactly; with two roles
    each role's term is what it would be alone (then weighted by its ``--*-weight``).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise ValueError("dr_grpo needs max_completion_length")
    role_tokens: dict[str, int] = {}
    role_seqs: dict[str, int] = {}
    role_mbs: dict[str, set] = {}
    mb_tokens: dict[tuple, int] = {}
    for r, n, mb in zip(roles, tokens, micro_batch, strict=True):
        role_tokens[r] = role_tokens.get(r, 0) + n
        role_seqs[r] = role_seqs.get(r, 0) + 1
        role_mbs.setdefault(r, set()).add(mb)
        mb_tokens[(r, mb)] = mb_tokens.get((r, mb), 0) + n
    out = []
    for r, n, mb in zip(roles, tokens, micro_batch, strict=True):
        if loss_type == "dapo":
            d = role_tokens[r]
        elif loss_type == "grpo":
            d = role_seqs[r] * n
        elif loss_type == "bnpo":
            d = len(role_mbs[r]) * mb_tokens[(r, mb)]
        else:
            d = role_seqs[r] * max_completion_length
        out.append(1.0 / max(d, 1))
    return out


def clip_fractions(coef_1: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                   epsilon: float = 0.2, epsilon_high: float | None = None) -> dict[str, torch.Tensor]:
    """Token sums (not means) of the clipped regions, as TRL counts them, plus the token count;
    sums add up across micro-batches and processes before one final division."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    low = ((coef_1 < 1 - epsilon) & (adv < 0)).expand_as(mask).float()
    high = ((coef_1 > 1 + eps_high) & (adv > 0)).expand_as(mask).float()
    return {"clip_low": (low * mask).sum(), "clip_high": (high * mask).sum(),
            "clip_region": (((low + high) > 0).float() * mask).sum(), "tokens": mask.sum()}


def describe(values: torch.Tensor) -> dict[str, float | int]:
    """n, mean, std, min, max of a 1-D tensor, JSON-ready (empty -> n 0 only)."""
    v = values.detach().to(torch.float64).flatten()
    if v.numel() == 0:
        return {"n": 0}
    return {"n": int(v.numel()), "mean": float(v.mean()), "std": float(v.std()) if v.numel() > 1 else 0.0,
            "min": float(v.min()), "max": float(v.max())}


@dataclass
class Sample:
    role: str  # "agent" | "designer"
    group: tuple
    reward: float
    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int]  # 1 = trained token
    sampler_logps: list[float] | None  # stored by the sampler (0.0 at masked tokens); None: unknown
    advantage: float = 0.0
    token_advantages: list[float] | None = None  # per completion token (turn credit); else advantage
    old_logps: list[float] | None = None  # the trainer's, before the first optimizer step
    temperature: float = 1.0  # the sampling temperature: training log-probs are taken at it


def plan_steps(n: int, batch_size: int, grad_accum: int, world: int, epochs: int, seed: int,
               ) -> list[list[list[list[int | None]]]]:
    """Optimizer steps -> per-process micro-batches (this plan is the same on every process).

    Each step has exactly ``grad_accum`` micro-batches on every process, as
    DeepSpeed and DDP need matching backward calls; a short last step is filled with ``None``
    (a zero-weight stand-in).
    """
    steps = []
    for epoch in range(epochs):
        order = list(range(n))
        random.Random(seed * 1000 + epoch).shuffle(order)
        steps += deal(order, batch_size, grad_accum, world)
    return steps


def deal(order: list[int], batch_size: int, grad_accum: int, world: int) -> list[list[list[list[int | None]]]]:
    """One pass over ``order`` as ``plan_steps`` lays it out: steps -> processes -> micro-batches."""
    per_step = batch_size * grad_accum * world
    steps = []
    for start in range(0, len(order), per_step):
        chunk = order[start:start + per_step]
        ranks = []
        for r in range(world):
            mine = chunk[r::world]
            ranks.append([mine[i * batch_size:(i + 1) * batch_size] or [None] for i in range(grad_accum)])
        steps.append(ranks)
    return steps


def collate(batch: list[Sample | None], fallback: Sample, pad_id: int, device: Any, packed: bool = False) -> dict:
    """One micro-batch: the model's inputs and the (B, C) tensors of the loss. ``None`` rows become a
    zero-weight, fully masked copy of ``fallback`` so every process runs the same backward calls.

    Padded (TRL's layout): prompts left-padded to P, completions right-padded to C, one row each.
    ``packed``: the B rows laid end to end in a single row of N = sum of their lengths, positions
    restarting at 0 in each (the layout of transformers' ``DataCollatorWithFlattening``), so no
    padding token is computed; ``index`` says where each completion token's log-prob lands in the
    packed output and ``valid`` where it goes back in (B, C). The loss tensors (``mask``, ``old``,
    ``adv``, ...) are (B, C) in both layouts, so everything after the forward is shared.
    ``temperature`` is shaped to divide the backbone's (B, L, H) or (1, N, H) hidden states.
    """
    rows = [(s, 1.0) if s is not None else (fallback, 0.0) for s in batch]
    if any(not s.prompt_ids for s, _ in rows):  # its first token would be scored from nothing (padded) or the row before
        raise ValueError("every sample needs at least one prompt token")
    P = max(len(s.prompt_ids) for s, _ in rows)
    C = max(len(s.completion_ids) for s, _ in rows)
    B = len(rows)
    attn = torch.zeros((B, P + C), dtype=torch.long)
    mask = torch.zeros((B, C))
    old, sampler = torch.zeros((B, C)), torch.zeros((B, C))
    adv, real, temp = torch.zeros((B, C)), torch.zeros(B), torch.ones(B)
    for i, (s, live) in enumerate(rows):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        attn[i, P - p:P + c] = 1
        mask[i, :c] = torch.tensor(s.mask, dtype=torch.float) * live
        old[i, :c] = torch.tensor(s.old_logps if s.old_logps is not None else [0.0] * c)
        # No stored log-probs: the sampler is taken to be the trainer (TIS weight 1).
        sampler[i, :c] = old[i, :c] if s.sampler_logps is None else torch.tensor(s.sampler_logps)
        adv[i, :c] = s.advantage if s.token_advantages is None else torch.tensor(s.token_advantages)
        real[i], temp[i] = live, s.temperature
    out = {"attention_mask": attn, "mask": mask, "old": old, "sampler": sampler, "adv": adv, "real": real,
           "P": P, "packed": packed}
    out.update(_packed_inputs(rows, mask) if packed else _padded_inputs(rows, mask, attn, P, pad_id))
    out["temperature"] = (temp.repeat_interleave(attn.sum(-1)).view(1, -1, 1) if packed
                          else temp.view(-1, 1, 1))
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in out.items()}


def _padded_inputs(rows: list, mask: torch.Tensor, attn: torch.Tensor, P: int, pad_id: int) -> dict:
    ids = torch.full(attn.shape, pad_id, dtype=torch.long)
    for i, (s, _) in enumerate(rows):
        ids[i, P - len(s.prompt_ids):P] = torch.tensor(s.prompt_ids)
        ids[i, P:P + len(s.completion_ids)] = torch.tensor(s.completion_ids)
    labels = torch.full_like(ids, -100)
    labels[:, P:] = torch.where(mask > 0, ids[:, P:], -100)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # real positions start at 0 despite left padding
    return {"input_ids": ids, "position_ids": pos, "labels": labels}


def _packed_inputs(rows: list, mask: torch.Tensor) -> dict:
    ids, labels, pos, index = [], [], [], []
    start = 0
    for i, (s, _) in enumerate(rows):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids += s.prompt_ids + s.completion_ids
        # The first label of each row is a prompt token's (-100), so no row is scored on the
        # previous row's last token, as the flattening collator's separator ensures.
        labels += [-100] * p + torch.where(mask[i, :c] > 0, torch.tensor(s.completion_ids), -100).tolist()
        pos += range(p + c)
        # The fused head's output j scores token j + 1: completion token k of this row is at
        # start + p + k in the packed row, so its log-prob is output start + p + k - 1.
        index += range(start + p - 1, start + p + c - 1)
        start += p + c
    lengths = torch.tensor([len(s.completion_ids) for s, _ in rows])
    valid = torch.arange(mask.size(1))[None, :] < lengths[:, None]
    return {"input_ids": torch.tensor([ids]), "position_ids": torch.tensor([pos]), "labels": torch.tensor([labels]),
            "index": torch.tensor(index), "valid": valid}
