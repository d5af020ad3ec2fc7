"""`spade update`'s balance of the two roles: each role's share of the update, where its samples go,
and its KL coefficient.

One optimizer pass trains the Agent's episodes and the Designer's completions together (one model,
one AdamW, one gradient clip). Without a stated balance, how much each role moves the model falls
out of the sample counts: a step holding no design trains only the Agent, and a step holding one
design gives that design as much weight as all the step's episodes together. Here the balance is a
setting, ``--designer-share F``:

- **the plan** spreads each role's samples evenly over the optimizer steps (each role shuffled on
  its own, then interleaved by position), so every step holds both roles whenever each role has
  at least as many samples as there are steps; with one role it is exactly
  ``grpo.plan_steps``'s plan;
- **the weights**: within a step each role's policy loss is normalised over its own tokens or
  sequences (``grpo.row_scales``), then multiplied by its step weight ``share * S / S_role`` (S
  steps in the pass, S_role of them holding the role). Summed over the pass, the Designer's terms
  weigh F and the Agent's 1 - F of the whole, whatever the sample counts; when both roles are in
  every step (the usual case) the step weights are simply F and 1 - F;
- **the shares resolve** over the roles that have samples: with only one role it gets 1. F = 0
  leaves the Designer out entirely (its rows are not read) and F = 1 the Agent, so such a run
  equals a one-role run on the same samples.

The KL to the reference (``--beta``, TRL's k3 estimator) is per role too: ``--kl-agent`` and
``--kl-designer`` override ``--beta`` for their role's tokens, one reference model serving both;
like TRL's ``beta`` it is added after the policy term and is not scaled by the share.
"""

from __future__ import annotations

import random

from spade_cli.core.artifacts import SpadeError
from spade_cli.training.config import UpdateConfig

ROLES = ("agent", "designer")


def stated_shares(cfg: UpdateConfig) -> dict[str, float]:
    if not 0.0 <= cfg.designer_share <= 1.0:
        raise SpadeError(f"--designer-share must lie in [0, 1], got {cfg.designer_share!r}")
    return {"agent": 1.0 - cfg.designer_share, "designer": cfg.designer_share}


def resolve_shares(cfg: UpdateConfig, present: set[str]) -> dict[str, float]:
    """Each role's share of the update over the roles that have samples (0 for an absent role)."""
    stated = stated_shares(cfg)
    total = sum(stated[r] for r in present)
    return {r: stated[r] / total if r in present and total > 0 else 0.0 for r in ROLES}


def betas(cfg: UpdateConfig) -> dict[str, float]:
    """Each role's KL coefficient: its own flag, else ``--beta``."""
    return {"agent": cfg.beta if cfg.kl_agent is None else cfg.kl_agent,
            "designer": cfg.beta if cfg.kl_designer is None else cfg.kl_designer}


def _order(roles: list[str], rng: random.Random) -> list[int]:
    """A shuffle of the sample indices in which each role sits evenly spread: the k-th of a role's
    n samples goes to the fractional position (k + 0.5) / n."""
    by_role: dict[str, list[int]] = {}
    for i, r in enumerate(roles):
        by_role.setdefault(r, []).append(i)
    if len(by_role) == 1:
        order = list(range(len(roles)))
        rng.shuffle(order)  # exactly grpo.plan_steps's order
        return order
    keyed = []
    for rank, r in enumerate(sorted(by_role)):
        mine = by_role[r]
        rng.shuffle(mine)
        keyed += [((k + 0.5) / len(mine), rank, i) for k, i in enumerate(mine)]
    return [i for *_, i in sorted(keyed)]


def plan(roles: list[str], batch_size: int, grad_accum: int, world: int, epochs: int, seed: int,
         ) -> list[list[list[list[int | None]]]]:
    """``grpo.plan_steps``'s structure (steps -> processes -> micro-batches of sample indices, a
    short step filled with ``None``) over an order that spreads each role over the steps."""
    from spade_cli.training import grpo

    steps = []
    for epoch in range(epochs):
        steps += grpo.deal(_order(roles, random.Random(seed * 1000 + epoch)), batch_size, grad_accum, world)
    return steps


def step_weights(steps: list, roles: list[str], shares: dict[str, float]) -> dict[str, dict]:
    """Per role: its share, the steps that hold it, and its weight in each of them, ``share * S /
    S_role``, so that the role's weights over the pass add up to its share of the pass's S steps."""
    held = {r: 0 for r in ROLES}
    for ranks in steps:
        for r in {roles[i] for mbs in ranks for mb in mbs for i in mb if i is not None}:
            held[r] += 1
    return {r: {"share": shares[r], "steps_with_samples": held[r],
                "step_weight": shares[r] * len(steps) / held[r] if held[r] else 0.0} for r in ROLES}
